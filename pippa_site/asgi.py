"""The site as one ASGI application: Django's own handler for the pages, the
admin and the API, and the official MCP SDK's streamable HTTP app at ``/mcp/``.

``make run`` serves it with gunicorn's uvicorn workers
(``pippa_site/gunicorn_conf.py``, with the deadlines and the connection cap
of ``pippa_site/shedding.py``), ``make dev`` with ``uvicorn --reload``.
``Site`` is a small router: ``/mcp`` and ``/mcp/`` go to the MCP door
(``pippa_mcp.asgi``, named by the ``PIPPA_MCP_APP`` setting: the ground
imports no app),
everything else to Django's ``ASGIHandler`` (``get_asgi_application()``),
which runs each request's synchronous middleware and view on a thread of
its own while it runs: one of those the router keeps for Django's requests
(``pippa_site.request_threads``), each with its database connection. The
lifespan starts and stops the MCP SDK's session manager, and at its end lets
those threads go.

Two bounds come first, because Django's handler reads a request's whole body
(spooling it to disk past ``FILE_UPLOAD_MAX_MEMORY_SIZE``) before any
middleware runs:

- a request head larger than ``MAX_HEADER_BYTES`` or with more than
  ``MAX_HEADER_FIELDS`` fields is refused (431): h11 bounds a head only
  while it is incomplete, so one that arrives in a single read is counted
  here;
- a body larger than a form may be (``DATA_UPLOAD_MAX_MEMORY_SIZE``) is
  refused (413) before a byte of it is read, declared or counted as it
  comes (a body sent in chunks declares no length), except the API's
  artifact upload that declares its length, once its bearer token has passed
  (``pippa_site.bearer``, with the API's authenticator), up to
  ``PIPPA_MAX_UPLOAD_BYTES``;
- a body larger than ``PIPPA_MAX_ANONYMOUS_BODY_BYTES`` (64 KiB: a login
  form is a few hundred bytes) from a client that has not signed in (no
  session holding a user, no token that passes) is refused (413) before it
  is read, declared or counted: 200 clients that never signed in pushing
  2.5 MB bodies kept the one event loop reading for about a second, every
  page waiting behind it.
"""

from __future__ import annotations

import json
import math
import os
import re
from importlib import import_module
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()

import anyio.to_thread  # noqa: E402
from asgiref.sync import sync_to_async  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import SESSION_KEY  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from django.http.cookie import parse_cookie  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

from pippa_site import throttle  # noqa: E402
from pippa_site.bearer import bearer_token, bearer_user  # noqa: E402
from pippa_site.request_threads import RequestThreads  # noqa: E402

MCP_PATHS = frozenset({"/mcp", "/mcp/"})
# The one door that takes a body past the form limit (api.api.task_artifact_upload).
UPLOAD_PATH = re.compile(r"^/api/v1/tasks/\d+/artifacts/?$")
ERR_BODY_TOO_LARGE = "request body too large"
ERR_BODY_SIGN_IN = (
    "request body too large for a client that has not signed in: sign in, or send"
    " a token"
)
ERR_HEADERS_TOO_LARGE = "request headers too large"
# The request line and headers, as gunicorn bounds them.
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADER_FIELDS = 100
_CHALLENGE = [(b"www-authenticate", b"Bearer")]


class BodyLimit:
    """Django's handler behind a bound on the request body (see the module)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        anonymous = settings.PIPPA_MAX_ANONYMOUS_BODY_BYTES
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            if not _is_upload(scope) or declared > settings.PIPPA_MAX_UPLOAD_BYTES:
                await _refuse(send, 413, ERR_BODY_TOO_LARGE)
                return
            if not await _upload_allowed(scope, send):
                return
            limit = settings.PIPPA_MAX_UPLOAD_BYTES
        elif (
            declared is not None
            and declared > anonymous
            and not await _signed_in(scope)
        ):
            await _refuse(send, 413, ERR_BODY_SIGN_IN)
            return
        # Past this, who sends is known to be signed in (or not, once asked).
        signed_in = declared is not None and declared > anonymous
        refused = False
        received = 0

        async def counted_receive():
            nonlocal received, refused, signed_in
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                detail = None
                if received > limit:
                    detail = ERR_BODY_TOO_LARGE
                elif received > anonymous and not signed_in:
                    # A body sent in chunks declares no length: asked once,
                    # when it passes what a client not signed in may send.
                    signed_in = await _signed_in(scope)
                    if not signed_in:
                        detail = ERR_BODY_SIGN_IN
                if detail is not None:
                    refused = True
                    await _refuse(send, 413, detail)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if not refused:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)


def _is_upload(scope: dict[str, Any]) -> bool:
    return scope.get("method") == "POST" and bool(UPLOAD_PATH.match(scope["path"]))


async def _upload_allowed(scope, send) -> bool:
    """Check a large upload's token before its body is read (the API checks again)."""
    raw = bearer_token(scope)
    status, seconds = 401, 0
    if raw is not None:
        user, status, seconds = await sync_to_async(
            _with_fresh_connection, thread_sensitive=False
        )(bearer_user, scope, raw)
        if user is not None:
            return True
    if status == 429:
        minutes = max(1, math.ceil(seconds / 60))
        detail = throttle.ERR_API_LOCKED.format(minutes=minutes)
        await _refuse(send, 429, detail, [(b"retry-after", str(seconds).encode())])
    else:
        await _refuse(send, 401, "Unauthorized", _CHALLENGE)
    return False


async def _signed_in(scope) -> bool:
    """Whether the request comes from a signed-in session or with a token
    that passes (``pippa_site.bearer``), asked before its body is read."""
    raw = bearer_token(scope)
    if raw is not None:
        user, _, _ = await sync_to_async(
            _with_fresh_connection, thread_sensitive=False
        )(bearer_user, scope, raw)
        return user is not None
    key = _cookies(scope).get(settings.SESSION_COOKIE_NAME)
    if not key:
        return False
    return await sync_to_async(_with_fresh_connection, thread_sensitive=False)(
        _session_signed_in, key
    )


def _cookies(scope) -> dict[str, str]:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            return parse_cookie(value.decode("latin-1"))
    return {}


def _session_signed_in(key: str) -> bool:
    """Whether session ``key`` exists and holds a signed-in user (Django's
    session store reads it; nothing is written)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
    return store.get(SESSION_KEY) is not None


def _with_fresh_connection(fn, *args):
    """``fn(*args)`` on a pool thread, its database connection closed after."""
    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()


def _headers_too_large(scope: dict[str, Any]) -> bool:
    headers = scope.get("headers", [])
    if len(headers) > MAX_HEADER_FIELDS:
        return True
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    size += sum(len(name) + len(value) + 4 for name, value in headers)
    return size > MAX_HEADER_BYTES


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send, status: int, detail: str, headers=()) -> None:
    """Answer in the API's words without reading the body, and close the connection."""
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
                # The body is left unread: the connection cannot be reused.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Site:
    """The ASGI application: the router, and the lifespan of the MCP app."""

    def __init__(self) -> None:
        self.django = BodyLimit(django_application)
        self.threads = RequestThreads(settings.PIPPA_REQUEST_THREADS)
        self.mcp = import_string(settings.PIPPA_MCP_APP)()

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "http":
            if _headers_too_large(scope):
                await _refuse(send, 431, ERR_HEADERS_TOO_LARGE)
            elif scope["path"] in MCP_PATHS:
                await self.mcp(scope, receive, send)
            else:
                async with self.threads():
                    await self.django(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)
        else:
            raise ValueError(f"unsupported ASGI scope type {kind!r}")

    async def lifespan(self, receive, send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        started = False
        try:
            async with self.mcp.running():
                # MCP tools run on anyio's worker threads: at most this many at
                # once per process, so a burst of tool calls leaves the pages
                # their share of the interpreter (a step run has threads of its
                # own, pippa_mcp.step_tools.run_next_step).
                limiter = anyio.to_thread.current_default_thread_limiter()
                limiter.total_tokens = settings.PIPPA_MCP_THREADS
                await send({"type": "lifespan.startup.complete"})
                started = True
                message = await receive()
        except BaseException as exc:
            if started:
                raise
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        finally:
            await self.threads.close()
        await send({"type": "lifespan.shutdown.complete"})


application = Site()
