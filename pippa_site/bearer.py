"""The bearer-token check for requests answered before Django sees them.

The MCP door (``pippa_mcp.asgi``) and the ASGI router's early answer to a large
API upload (``pippa_site.asgi``) check a token here, with the JSON API's
service (``api.services.token_authenticate``) and the API's throttle
(``pippa_site.throttle``). Runs on a pool thread (``SyncPool.run``).
"""

from __future__ import annotations

import io
from typing import Any


def bearer_token(scope: dict[str, Any]) -> str | None:
    """The raw token of an ``Authorization: Bearer`` header, or None."""
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            scheme, _, raw = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and raw.strip():
                return raw.strip()
            return None
    return None


def bearer_user(scope: dict[str, Any], raw: str):
    """Return (user, 200), or (None, 401 / 429): the API's token rule and throttle.

    A valid token is looked up before any lockout, so only failing tokens are
    throttled; a failing one is counted against the client's address.
    """
    from django.core.handlers.asgi import ASGIRequest

    from api.services import token_authenticate
    from pippa_site import throttle

    request = ASGIRequest(scope, io.BytesIO())
    user = token_authenticate(raw=raw)
    if user is not None:
        throttle.api_token_succeeded(request)
        return user, 200
    if throttle.api_token_locked_out(request):
        return None, 429
    throttle.api_token_failed(request)
    return None, 401
