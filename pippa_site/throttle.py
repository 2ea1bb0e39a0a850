"""Login throttling: django-axes for the dashboard and admin logins, and the
same counters, limit and cool-off for failed API bearer tokens.

Logins go through ``django.contrib.auth.authenticate``, which axes watches
(``AxesStandaloneBackend`` refuses a locked-out name and address; its
middleware answers with ``registration/locked_out.html``, status 429).

An API token is not a username and password, so the bearer check
(``api_token_user``, for the API and MCP doors alike) reports its failures to
axes itself: a failed token is ``user_login_failed`` for the name
``API_TOKEN_NAME`` from the client's address. A valid token is looked up
first and always answers, so only failing tokens are throttled: a stranger
guessing from Dad's address cannot lock out Dad's runner, and a good token
never clears the address's failures (one valid token would otherwise reset a
guesser's count). The limit, the cool-off and the reset commands
(``axes_reset_ip``, ``axes_reset_username``) are the ones for logins.

Lockouts cannot be extended by trying again: a try refused during a lockout
is not counted (``AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False`` for
logins, the same rule here for tokens), so the cool-off runs from the failure
that locked. Every 429 says in ``Retry-After`` how many seconds are left.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.db.models import Max
from django.http import HttpRequest
from django.utils import timezone

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


class TokenLockedOut(Exception):
    """A failing token from an address that is locked out (429, ``Retry-After``)."""

    def __init__(self, seconds: int):
        self.seconds = seconds
        minutes = max(1, math.ceil(seconds / 60))
        super().__init__(ERR_API_LOCKED.format(minutes=minutes))


def api_token_user(request: HttpRequest, *, raw: str, authenticate: Callable):
    """Return the user of bearer token ``raw``, or None for a token that fails.

    1. A valid token answers at once, whatever the address's failures: only
       failing tokens are throttled, and a good one clears nothing.
    2. A failing token from a locked-out address raises ``TokenLockedOut``,
       uncounted (counting it would extend the lockout).
    3. Any other failing token is counted against the address.
    """
    user = authenticate(raw=raw)
    if user is not None:
        return user
    if api_token_locked_out(request):
        raise TokenLockedOut(lockout_seconds_left(request, username=API_TOKEN_NAME))
    api_token_failed(request)
    return None


def lockout_seconds_left(request: HttpRequest, *, username: str | None) -> int:
    """Seconds until the lockout of ``username`` from this address ends (at least 1)."""
    from axes.models import AccessAttempt

    cooloff = settings.AXES_COOLOFF_TIME
    if not isinstance(cooloff, timedelta):
        cooloff = timedelta(hours=float(cooloff or 0))
    latest = AccessAttempt.objects.filter(
        ip_address=client_ip(request), username=username
    ).aggregate(latest=Max("attempt_time"))["latest"]
    if latest is None:
        return max(1, math.ceil(cooloff.total_seconds()))
    left = latest + cooloff - timezone.now()
    return max(1, math.ceil(left.total_seconds()))


ERR_API_LOCKED = (
    "too many failed API token attempts from this address; try again in {minutes} "
    "minutes"
)


def lockout_response(request: HttpRequest, original_response, credentials):
    """The answer to a locked-out client: JSON 429 on the API, the page elsewhere."""
    from django.http import JsonResponse
    from django.shortcuts import render

    seconds = lockout_seconds_left(
        request, username=(credentials or {}).get("username")
    )
    if request.path.startswith("/api/"):
        response = JsonResponse(
            {"detail": ERR_API_LOCKED.format(minutes=max(1, math.ceil(seconds / 60)))},
            status=429,
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
    response["Retry-After"] = str(seconds)
    return response
