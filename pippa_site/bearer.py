"""The bearer-token check for requests answered before Django sees them.

The ASGI router's early answer to a large API upload (``pippa_site.asgi``)
and the MCP door (``pippa_mcp.asgi``) check a token here, each with its own
door's authenticator, under the API's throttle (``pippa_site.throttle``).
The ground imports no app: the router's authenticator is named by the
``PIPPA_BEARER_AUTHENTICATE`` setting (the JSON API's
``api.services.token_authenticate``), read with ``import_string``; the MCP
door passes its own (static API tokens and MCP sign-ins, ``api.oauth``).
Runs on a worker thread, never on the event loop (the router's ``sync_to_async``;
the MCP door's own threads).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


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
    client's address. Only the tokens ``PIPPA_BEARER_AUTHENTICATE`` accepts
    pass here (the JSON API's static tokens).
    """
    authenticate = import_string(settings.PIPPA_BEARER_AUTHENTICATE)
    return bearer_checked(scope_request(scope), raw, authenticate)


def site_base(request) -> str:
    """This site's address as the request reached it (scheme and host)."""
    return request.build_absolute_uri("/").rstrip("/")


def scope_request(scope: dict[str, Any]):
    """A Django request for ``scope``, without its body (headers, host, address)."""
    from django.core.handlers.asgi import ASGIRequest

    return ASGIRequest(scope, io.BytesIO())


def bearer_checked(
    request, raw: str, authenticate: Callable[..., Any]
) -> tuple[Any, int, int]:
    """``authenticate(raw=raw)`` under the API's throttle, as ``bearer_user`` answers."""
    from pippa_site import throttle

    try:
        user = throttle.api_token_user(request, raw=raw, authenticate=authenticate)
    except throttle.TokenLockedOut as exc:
        return None, 429, exc.seconds
    return (user, 200, 0) if user is not None else (None, 401, 0)
