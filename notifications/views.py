"""The notification settings page: whether and where a person is told that a step waits."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from notifications.outbox import (
    NotifyError,
    mail_server_url,
    notify_settings_get,
    notify_settings_save,
)

MSG_SAVED_ON = "Saved: you will be told when a step waits for you."
MSG_SAVED_OFF = "Saved: notifications are off."


@require_http_methods(["GET", "POST"])
@login_required
def notify_settings(request: HttpRequest) -> HttpResponse:
    """GET: the user's choice; POST: check it with Apprise, save it, redirect."""
    current = notify_settings_get(user=request.user)
    context = {
        "enabled": current.enabled,
        "addresses": current.addresses,
        "mail_server": bool(mail_server_url()),
        "delay": round(settings.PIPPA_NOTIFY_DELAY_SECONDS),
        "window_minutes": max(1, round(settings.PIPPA_NOTIFY_WINDOW_SECONDS / 60)),
    }
    if request.method == "POST":
        enabled = request.POST.get("enabled") == "on"
        addresses = request.POST.get("addresses", "")[:5000]
        try:
            notify_settings_save(
                user=request.user, enabled=enabled, addresses=addresses
            )
        except NotifyError as exc:
            context.update(enabled=enabled, addresses=addresses, error=str(exc))
            return render(request, "notifications/settings.html", context, status=400)
        messages.success(request, MSG_SAVED_ON if enabled else MSG_SAVED_OFF)
        return redirect("notify_settings")
    return render(request, "notifications/settings.html", context)
