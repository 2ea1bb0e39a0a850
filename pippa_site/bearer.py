"""The bearer-token check for requests answered before Django sees them.

The MCP door (``pippa_mcp.asgi``) and the ASGI router's early answer to a large
API upload (``pippa_site.asgi``) check a token here, with the JSON API's
service (``api.services.token_authenticate``; at ``/mcp/`` also the access
tokens of MCP sign-ins, ``api.oauth``) and the API's throttle
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
    client's address. Only static API tokens pass here (the JSON API's).
    """
    from api.services import token_authenticate

    return _checked(_request(scope), raw, token_authenticate)


def bearer_mcp_user(scope: dict[str, Any], raw: str) -> tuple[Any, int, int]:
    """``bearer_user`` for ``/mcp/``: a static API token, or the access token
    of an MCP sign-in issued for this server's ``/mcp/`` (``api.oauth``)."""
    from functools import partial

    from api.oauth import mcp_resource, mcp_token_user

    request = _request(scope)
    resource = mcp_resource(site_base(request))
    return _checked(request, raw, partial(mcp_token_user, resource=resource))


def site_base(request) -> str:
    """This site's address as the request reached it (scheme and host)."""
    return request.build_absolute_uri("/").rstrip("/")


def mcp_challenge(scope: dict[str, Any], *, error: str | None = None) -> bytes:
    """The ``WWW-Authenticate`` of a 401 at ``/mcp/``: where to sign in (RFC 9728)."""
    from api.oauth import mcp_challenge as challenge

    return challenge(site_base(_request(scope)), error=error).encode("latin-1")


def _request(scope: dict[str, Any]):
    from django.core.handlers.asgi import ASGIRequest

    return ASGIRequest(scope, io.BytesIO())


def _checked(request, raw: str, authenticate) -> tuple[Any, int, int]:
    from pippa_site import throttle

    try:
        user = throttle.api_token_user(request, raw=raw, authenticate=authenticate)
    except throttle.TokenLockedOut as exc:
        return None, 429, exc.seconds
    return (user, 200, 0) if user is not None else (None, 401, 0)
