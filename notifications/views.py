"""The notification settings page: whether and where a person is told that a
step waits, a test message, and turning messages off from a message itself."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from notifications.outbox import (
    NotifyError,
    mail_server_url,
    notify_settings_get,
    notify_settings_save,
    notify_test_send,
    notify_turn_off,
    notify_unsubscribe_user,
)
from pippa_site.errors import NotFound
from pippa_site.login import login_required

MSG_SAVED_ON = "Saved: you will be told when a step waits for you."
MSG_SAVED_OFF = "Saved: notifications are off."
MSG_SAVED_BUT_OFF = (
    "Saved your address, but messages are off: tick “Send me a message” and"
    " save again to get them."
)
MSG_TEST_SENT = (
    "A test message went to {where}: check that it arrived. It can take a minute."
)
MSG_TEST_NOT_SAVED = "These addresses are not saved yet: press Save to keep them."
MSG_TEST_FAILED = "The test message did not go out: {error}."
MAX_FORM_CHARS = 5000


def _context(request: HttpRequest) -> dict:
    current = notify_settings_get(user=request.user)
    return {
        # Ticked on a first visit: someone who opens this page and gives an
        # address wants the messages.
        "enabled": current.enabled if current.pk else True,
        "addresses": current.addresses,
        "saved_addresses": current.addresses,
        "mail_server": bool(mail_server_url()),
        "delay": round(settings.PIPPA_NOTIFY_DELAY_SECONDS),
        "window_minutes": max(1, round(settings.PIPPA_NOTIFY_WINDOW_SECONDS / 60)),
    }


@require_http_methods(["GET", "POST"])
@login_required
def notify_settings(request: HttpRequest) -> HttpResponse:
    """GET: the user's choice; POST: check it, save it, redirect."""
    context = _context(request)
    if request.method == "POST":
        enabled = request.POST.get("enabled") == "on"
        addresses = request.POST.get("addresses", "")[:MAX_FORM_CHARS]
        try:
            saved = notify_settings_save(
                user=request.user, enabled=enabled, addresses=addresses
            )
        except NotifyError as exc:
            context.update(enabled=enabled, addresses=addresses, error=str(exc))
            return render(request, "notifications/settings.html", context, status=400)
        if enabled:
            messages.success(request, MSG_SAVED_ON)
        elif saved.address_list:
            messages.info(request, MSG_SAVED_BUT_OFF)
        else:
            messages.success(request, MSG_SAVED_OFF)
        return redirect("notify_settings")
    return render(request, "notifications/settings.html", context)


@require_POST
@login_required
def notify_settings_test(request: HttpRequest) -> HttpResponse:
    """Send a test message to the addresses in the form (not saved); show the
    form again as it was, with what happened."""
    context = _context(request)
    enabled = request.POST.get("enabled") == "on"
    addresses = request.POST.get("addresses", "")[:MAX_FORM_CHARS]
    context.update(enabled=enabled, addresses=addresses)
    try:
        error = notify_test_send(user=request.user, addresses=addresses)
    except NotifyError as exc:
        context["error"] = str(exc)
        return render(request, "notifications/settings.html", context, status=400)
    lines = [line.strip() for line in addresses.splitlines() if line.strip()]
    if error is not None:
        messages.error(request, MSG_TEST_FAILED.format(error=error))
    else:
        where = lines[0] if len(lines) == 1 else f"your {len(lines)} addresses"
        messages.success(request, MSG_TEST_SENT.format(where=where))
    if "\n".join(lines) != context["saved_addresses"]:
        messages.info(request, MSG_TEST_NOT_SAVED)
    return render(request, "notifications/settings.html", context)


@csrf_exempt  # a mail client's one-click POST has no cookie; the token is the proof
@require_http_methods(["GET", "POST"])
def notify_off(request: HttpRequest, token: str) -> HttpResponse:
    """ "Turn these off", from a message: no login, the signed token names whose.

    GET asks (a mail scanner that follows links must not turn anything off);
    POST turns them off: the page's button, or a mail client's RFC 8058
    one-click ``List-Unsubscribe=One-Click``.
    """
    user_id = notify_unsubscribe_user(token)
    if user_id is None:
        raise NotFound("this link is not one of this site's")
    if request.method == "POST":
        notify_turn_off(user_id=user_id)
        return render(request, "notifications/off.html", {"done": True})
    return render(request, "notifications/off.html", {"done": False})
