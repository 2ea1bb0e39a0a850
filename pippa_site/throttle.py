"""Login throttling: django-axes for the dashboard and admin logins, and the
same counters, limit and cool-off for failed API bearer tokens.

Logins go through ``django.contrib.auth.authenticate``, which axes watches
(``AxesStandaloneBackend`` refuses a locked-out name and address; its
middleware answers with ``registration/locked_out.html``, status 429).

An API token is not a username and password, so the bearer check reports its
failures to axes itself: a failed token is ``user_login_failed`` for the name
``API_TOKEN_NAME`` from the client's address, and a locked-out address gets 429
before its token is even looked up. The limit, the cool-off and the reset
commands (``axes_reset_ip``, ``axes_reset_username``) are the ones for logins.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest

# The "username" a failed bearer token is counted under.
API_TOKEN_NAME = "api-token"


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: the proxy's last X-Forwarded-For hop when behind one."""
    if settings.PIPPA_BEHIND_PROXY:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        if hops:
            return hops[-1]
    return request.META.get("REMOTE_ADDR")


def _credentials() -> dict[str, str]:
    return {"username": API_TOKEN_NAME}


def api_token_locked_out(request: HttpRequest) -> bool:
    """Return whether this address has used up its failed token attempts."""
    from axes.handlers.proxy import AxesProxyHandler

    if not settings.AXES_ENABLED:
        return False
    AxesProxyHandler.update_request(request)
    return AxesProxyHandler.is_locked(request, credentials=_credentials())


def api_token_failed(request: HttpRequest) -> None:
    """Count a failed bearer token against this address."""
    user_login_failed.send(sender=__name__, credentials=_credentials(), request=request)


def api_token_succeeded(request: HttpRequest) -> None:
    """A good token clears this address's failed token attempts (as a login does)."""
    from axes.utils import reset

    if settings.AXES_ENABLED and settings.AXES_RESET_ON_SUCCESS:
        address = client_ip(request)
        if address and _has_failures(address):
            reset(ip=address, username=API_TOKEN_NAME)


def _has_failures(address: str) -> bool:
    from axes.models import AccessAttempt

    return AccessAttempt.objects.filter(
        ip_address=address, username=API_TOKEN_NAME
    ).exists()


ERR_API_LOCKED = (
    "too many failed API token attempts from this address; try again in {minutes} "
    "minutes"
)


def lockout_response(request: HttpRequest, original_response, credentials):
    """The answer to a locked-out client: JSON 429 on the API, the page elsewhere."""
    from django.http import JsonResponse
    from django.shortcuts import render

    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    if request.path.startswith("/api/"):
        response = JsonResponse(
            {"detail": ERR_API_LOCKED.format(minutes=minutes)}, status=429
        )
    else:
        response = render(
            request,
            "registration/locked_out.html",
            {
                "failure_limit": settings.AXES_FAILURE_LIMIT,
                "cooloff_timedelta": settings.AXES_COOLOFF_TIME,
            },
            status=429,
        )
    response["Retry-After"] = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    return response
