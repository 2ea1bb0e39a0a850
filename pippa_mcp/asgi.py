"""Streamable HTTP at ``/mcp/``: the official SDK's ASGI transport, mounted natively.

``pippa_site.asgi`` routes ``/mcp`` and ``/mcp/`` here. The SDK's
``StreamableHTTPSessionManager`` runs *stateless* (nothing is kept between
requests: any worker process answers any request, and a restarted server loses
nothing but the call in flight) and is started by the ASGI lifespan. Before a
request reaches it, this door:

- answers ``GET`` and ``DELETE`` with 405 at once: a stateless server has no
  stream to offer and no session to end (the TypeScript SDK's clients open
  ``GET /mcp/`` right after ``initialize`` and carry on after a 405);
- checks ``Host`` and ``Origin`` with the SDK's ``TransportSecurityMiddleware``,
  against ``ALLOWED_HOSTS`` and ``CSRF_TRUSTED_ORIGINS`` (421 / 403);
- authenticates the bearer token (a static API token, or the access token of
  an MCP sign-in issued for this ``/mcp/``: ``bearer_mcp_user``)
  on a worker thread, counting a failed token with the API's throttle
  (``pippa_site.throttle``): 401 with ``WWW-Authenticate: Bearer
  resource_metadata=...`` (where a client learns to sign in, RFC 9728), or
  429 with ``Retry-After`` once the address is locked out;
- bounds each user's requests in flight, whichever of the user's tokens or
  sign-ins they come with (``PIPPA_MCP_CALLS_PER_USER``, ``pippa_site.slots``:
  429 with ``Retry-After``);
- reads the body up to ``PIPPA_MCP_MAX_BODY_BYTES``; a larger one is read to
  its end (up to a bound, within a time limit) and answered 413 with a JSON-RPC
  error, so the client's connection and session carry on; past the bound it is
  answered with ``Connection: close``.

Then the SDK answers, with the tools acting as the token's user
(``pippa_mcp.door.acting_as``: the ContextVar is copied into the SDK's task
and from there into the worker thread each tool runs in).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
from django.conf import settings
from django.http.request import validate_host
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import (
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from starlette.requests import Request

from api.oauth import mcp_challenge as oauth_challenge
from api.oauth import mcp_resource, mcp_token_user
from pippa_mcp.door import acting_as, in_thread
from pippa_mcp.messages import invalid_request_id
from pippa_mcp.server import build_server
from pippa_site import metrics, throttle
from pippa_site.bearer import (
    bearer_checked,
    bearer_token,
    scope_request,
    site_base,
)
from pippa_site.errors import TooMany
from pippa_site.slots import MCP_CALLS

log = logging.getLogger("pippa.mcp")

ERR_AUTH = (
    "missing, unknown, expired or revoked token (send Authorization: Bearer"
    " <token>: an API token, or sign in: see WWW-Authenticate)"
)
ERR_METHOD = "this MCP server is stateless: send JSON-RPC messages with POST"
ERR_TOO_LARGE = "request body too large (at most {limit} bytes)"
ERR_SLOW_BODY = "the request body did not arrive in time"
ERR_NOT_STARTED = "the MCP server is not running (the ASGI lifespan did not start it)"
# A refused body is read to its end up to this many bytes, for this long, so
# the client can read the answer and reuse its connection; past either, the
# answer closes the connection.
DRAIN_MAX_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 10.0
# How long a whole request body may take to arrive.
BODY_SECONDS = 60.0


def bearer_mcp_user(scope: dict[str, Any], raw: str) -> tuple[Any, int, int]:
    """``pippa_site.bearer.bearer_user`` for ``/mcp/``: a static API token, or
    the access token of an MCP sign-in issued for this server's ``/mcp/``
    (``api.oauth``). Runs on a worker thread."""
    request = scope_request(scope)
    resource = mcp_resource(site_base(request))
    return bearer_checked(request, raw, partial(mcp_token_user, resource=resource))


def mcp_challenge(scope: dict[str, Any], *, error: str | None = None) -> bytes:
    """The ``WWW-Authenticate`` of a 401 at ``/mcp/``: where to sign in (RFC 9728)."""
    base = site_base(scope_request(scope))
    return oauth_challenge(base, error=error).encode("latin-1")


class MCPApp:
    """The ``/mcp/`` door: checks, then the SDK's streamable HTTP transport."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the SDK's session manager (one per server process and lifespan)."""
        manager = StreamableHTTPSessionManager(
            app=build_server()._lowlevel_server,
            stateless=True,
            json_response=False,
            # Host and Origin are checked here first (with Django's wildcards).
            security_settings=None,
            max_request_body_size=settings.PIPPA_MCP_MAX_BODY_BYTES,
        )
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope, receive, send) -> None:
        """Answer, and time the answer by door (``pippa_site.metrics``)."""
        started = time.perf_counter()
        status = [500]

        async def sent(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._door(scope, receive, sent)
        finally:
            metrics.request_observed(
                door="mcp", status=status[0], seconds=time.perf_counter() - started
            )

    async def _door(self, scope, receive, send) -> None:
        method = scope["method"]
        if method != "POST":
            await _refuse(
                receive,
                send,
                405,
                ERR_METHOD,
                headers=[(b"allow", b"POST")],
            )
            return
        refused = await _security_check(scope, receive)
        if refused is not None:
            await _drain(receive)
            await refused(scope, receive, send)
            return
        if self.manager is None:
            await _refuse(receive, send, 503, ERR_NOT_STARTED)
            return
        raw = bearer_token(scope)
        if raw is None:
            challenge = [(b"www-authenticate", mcp_challenge(scope))]
            await _refuse(receive, send, 401, ERR_AUTH, headers=challenge)
            return
        user, status, seconds = await in_thread(bearer_mcp_user, scope, raw)
        if user is None:
            if status == 429:
                await _refuse(
                    receive,
                    send,
                    429,
                    _locked_message(seconds),
                    headers=_retry(seconds),
                )
            else:
                challenge = mcp_challenge(scope, error="invalid_token")
                await _refuse(
                    receive,
                    send,
                    401,
                    ERR_AUTH,
                    headers=[(b"www-authenticate", challenge)],
                )
            return
        try:
            ticket = MCP_CALLS.take(user.pk)
        except TooMany as exc:
            await _refuse(
                receive,
                send,
                429,
                str(exc),
                headers=[(b"retry-after", str(exc.retry_after).encode())],
            )
            return
        try:
            await self._answer(scope, receive, send, user)
        finally:
            MCP_CALLS.give_back(ticket)

    async def _answer(self, scope, receive, send, user) -> None:
        limit = settings.PIPPA_MCP_MAX_BODY_BYTES
        body = bytearray()
        more = True
        with anyio.move_on_after(BODY_SECONDS) as reading:
            while more and len(body) <= limit:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
        if reading.cancelled_caught:
            await _answer_error(send, 408, ERR_SLOW_BODY, close=True)
            return
        if len(body) > limit:
            await _refuse(
                receive,
                send,
                413,
                ERR_TOO_LARGE.format(limit=limit),
                already=len(body),
                more=more,
            )
            return

        if (reason := invalid_request_id(bytes(body))) is not None:
            await _answer_error(send, 400, reason)
            return

        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        with acting_as(user):
            await self.manager.handle_request(scope, replay, send)


def _retry(seconds: int) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", str(seconds).encode())]


def _locked_message(seconds: int) -> str:
    return throttle.ERR_API_LOCKED.format(minutes=max(1, math.ceil(seconds / 60)))


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def transport_security(
    host: str | None, origin: str | None
) -> TransportSecuritySettings:
    """The SDK's Host/Origin settings for this request, from Django's settings.

    Exact ``ALLOWED_HOSTS`` entries are allowed on any port, and as origins over
    http and https; ``CSRF_TRUSTED_ORIGINS`` are allowed origins. A wildcard
    entry (``*``, ``.example.com``) is matched with Django's own rule and, when
    it matches, the request's host (or origin) is added for this request.
    """
    hosts: list[str] = []
    origins: list[str] = []
    for entry in settings.ALLOWED_HOSTS:
        if entry == "*" or entry.startswith("."):
            continue
        hosts += [entry, f"{entry}:*"]
        origins += [f"{s}://{entry}{p}" for s in ("http", "https") for p in ("", ":*")]
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        if "*" not in entry:
            origins.append(entry)
    if host and validate_host(_hostname(host), settings.ALLOWED_HOSTS):
        hosts.append(host)
    if origin:
        parts = urlsplit(origin)
        allowed_host = bool(parts.hostname) and validate_host(
            parts.hostname, settings.ALLOWED_HOSTS
        )
        trusted = any(_wildcard_origin(e, parts) for e in settings.CSRF_TRUSTED_ORIGINS)
        if allowed_host or trusted:
            origins.append(origin)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=origins,
    )


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _wildcard_origin(entry: str, parts) -> bool:
    if "*" not in entry:
        return False
    scheme, _, pattern = entry.partition("://")
    suffix = pattern.removeprefix("*")
    return parts.scheme == scheme and (parts.netloc or "").endswith(suffix)


async def _security_check(scope, receive):
    """The SDK's Host and Origin check; return its refusal, or None."""
    host, origin = _header(scope, b"host"), _header(scope, b"origin")
    middleware = TransportSecurityMiddleware(transport_security(host, origin))
    return await middleware.validate_request(Request(scope, receive), is_post=True)


async def _drain(receive, *, limit: int = DRAIN_MAX_BYTES) -> bool:
    """Read and drop the rest of the body; return whether it ended in time."""
    read = 0
    with anyio.move_on_after(DRAIN_SECONDS):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            read += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
            if read > limit:
                return False
    return False


async def _refuse(
    receive,
    send,
    status: int,
    message: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    already: int = 0,
    more: bool = True,
) -> None:
    """Answer ``status`` with a JSON-RPC error, after reading the body to its end.

    A body read to its end leaves the connection usable for the client's next
    request; one that is too large or too slow is answered with
    ``Connection: close`` instead of a reset halfway through its upload.
    """
    ended = await _drain(receive, limit=DRAIN_MAX_BYTES - already) if more else True
    await _answer_error(send, status, message, headers=headers, close=not ended)


async def _answer_error(
    send,
    status: int,
    message: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    close: bool = False,
) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    ).encode()
    out = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    if close:
        out.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})
