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


def bearer_user(scope: dict[str, Any], raw: str) -> tuple[Any, int, int]:
    """Return (user, 200, 0), or (None, 401, 0), or (None, 429, seconds left).

    The API's rule: a valid token is looked up before any lockout, so only
    failing tokens are throttled; a failing one is counted against the
    client's address.
    """
    from django.core.handlers.asgi import ASGIRequest

    from api.services import token_authenticate
    from pippa_site import throttle

    request = ASGIRequest(scope, io.BytesIO())
    try:
        user = throttle.api_token_user(
            request, raw=raw, authenticate=token_authenticate
        )
    except throttle.TokenLockedOut as exc:
        return None, 429, exc.seconds
    return (user, 200, 0) if user is not None else (None, 401, 0)
