"""The site as one ASGI application: Django for pages, admin and API, the
official MCP SDK's streamable HTTP app at ``/mcp/``.

``make run`` serves it with gunicorn's uvicorn workers
(``pippa_site/gunicorn_conf.py``), ``make dev`` with ``uvicorn --reload``.
A small router sends ``/mcp`` and ``/mcp/`` to ``pippa_mcp.asgi`` and
everything else to Django; the ASGI lifespan starts the SDK's session manager
and the pool of threads Django's synchronous code runs on
(``pippa_site.sync_pool``), and stops both.

Under Django (``PippaASGIHandler``): a request's body is read on the event loop,
then the request borrows a pool thread for its middleware, view and signals,
and gives it back before its answer is sent (the middleware chain is loaded in
its synchronous mode, as under WSGI, and runs with the view in one go on that
thread); a streamed answer (a blob
download) is read chunk by chunk from a thread instead of whole into memory,
as Django's own handler does with a synchronous iterator. A body larger than a
form may be (``DATA_UPLOAD_MAX_MEMORY_SIZE``) is read only for the API's
upload, and only once its bearer token has passed (``pippa_site.bearer``: the
API's service and throttle; the view checks it again); anything else that
large, or an upload past ``PIPPA_MAX_UPLOAD_BYTES``, is refused before a byte
of it is read (413, ``Connection: close``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from contextvars import ContextVar
from typing import Any

import anyio.to_thread
import django
from asgiref.sync import sync_to_async

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from pippa_mcp.asgi import MCPApp  # noqa: E402
from pippa_site import throttle  # noqa: E402
from pippa_site.bearer import bearer_token, bearer_user  # noqa: E402
from pippa_site.sync_pool import Lease, SyncPool  # noqa: E402

MCP_PATHS = frozenset({"/mcp", "/mcp/"})
# The one door that takes a body past the form limit (api.api.task_artifact_upload).
UPLOAD_PATH = re.compile(r"^/api/v1/tasks/\d+/artifacts/?$")
ERR_BODY_TOO_LARGE = "request body too large"
ERR_HEADERS_TOO_LARGE = "request headers too large"
# The request line and headers, as gunicorn's gthread workers bounded them.
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADER_FIELDS = 100
SMALL, LARGE_UPLOAD, TOO_LARGE = "small", "large upload", "too large"
_CHALLENGE = [(b"www-authenticate", b"Bearer")]
_END = object()
# A streamed answer up to this size is read from its file in one go.
SMALL_STREAM_BYTES = 256 * 1024
_lease: ContextVar[Lease] = ContextVar("pippa_lease")


class PippaASGIHandler(ASGIHandler):
    """Django's ASGI handler on a fixed pool of threads (see the module docstring)."""

    def __init__(self, site: Site) -> None:
        super().__init__()
        # Every middleware and view here is synchronous. Django's async chain
        # would hop between the event loop and the request's thread three
        # times a request (into the outer middleware, back out for the
        # async-capable inner one, in again for the view); loaded in its
        # synchronous mode, as the WSGI handler loads it, the chain runs whole
        # on the request's pool thread: one hop (get_response_async).
        self.load_middleware(is_async=False)
        self.site = site

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP only, not {scope['type']}")
        body = _body_kind(scope)
        if body == TOO_LARGE:
            await _refuse(send, 413, ERR_BODY_TOO_LARGE)
            return
        if body == LARGE_UPLOAD and not await self._upload_allowed(scope, send):
            return
        lease = Lease(self.site.pool())
        token = _lease.set(lease)
        try:
            await self.handle(scope, receive, send)
        finally:
            await lease.exit()
            _lease.reset(token)

    async def _upload_allowed(self, scope, send) -> bool:
        """Check a large upload's token before its body is read (the API checks again)."""
        raw = bearer_token(scope)
        status, seconds = 401, 0
        if raw is not None:
            user, status, seconds = await self.site.pool().run(bearer_user, scope, raw)
            if user is not None:
                return True
        if status == 429:
            minutes = max(1, math.ceil(seconds / 60))
            detail = throttle.ERR_API_LOCKED.format(minutes=minutes)
            await _refuse(send, 429, detail, [(b"retry-after", str(seconds).encode())])
        else:
            await _refuse(send, 401, "Unauthorized", _CHALLENGE)
        return False

    async def read_body(self, receive):
        body = await super().read_body(receive)
        # The body is in: from here to the answer, one pool thread.
        await _lease.get().enter()
        return body

    async def send_response(self, response, send):
        # The answer is made: sending it (to a slow reader too) needs no thread.
        await _lease.get().exit()
        if response.streaming and not response.is_async:
            response.streaming_content = _chunks_from_thread(
                response.streaming_content, _declared_length(response)
            )
        await super().send_response(response, send)


async def _chunks_from_thread(iterator, length: int | None):
    """Yield a synchronous iterator's chunks, read in a worker thread.

    A small answer (a static file, a preview) is read in one go; a larger one a
    chunk at a time, so a download is never gathered into memory.
    """
    loop = asyncio.get_running_loop()
    if length is not None and length <= SMALL_STREAM_BYTES:
        for chunk in await loop.run_in_executor(None, list, iterator):
            yield chunk
        return
    chunks = iter(iterator)
    while (chunk := await loop.run_in_executor(None, next, chunks, _END)) is not _END:
        yield chunk


def _declared_length(response) -> int | None:
    try:
        return int(response["Content-Length"])
    except (KeyError, ValueError):
        return None


def _body_kind(scope: dict[str, Any]) -> str:
    """Whether a body may be read: a form's size, an upload's, or none that large."""
    declared = _content_length(scope)
    if declared is None or declared <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        return SMALL
    if UPLOAD_PATH.match(scope.get("path", "")) and scope.get("method") == "POST":
        return TOO_LARGE if declared > settings.PIPPA_MAX_UPLOAD_BYTES else LARGE_UPLOAD
    return TOO_LARGE


def _headers_too_large(scope: dict[str, Any]) -> bool:
    """Whether the request line and headers pass the server's bounds.

    h11 refuses a header block past 16 KiB only while it is incomplete; one
    that arrives in a single read reaches the application, so it is counted
    here too.
    """
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
    """The ASGI application: routes, and owns what the lifespan starts."""

    def __init__(self) -> None:
        self._pool: SyncPool | None = None
        self.django = PippaASGIHandler(self)
        self.mcp = MCPApp(run_sync=lambda fn, *args: self.pool().run(fn, *args))

    def pool(self) -> SyncPool:
        if self._pool is None:
            self._pool = SyncPool(settings.PIPPA_WEB_THREADS)
        return self._pool

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "http":
            if _headers_too_large(scope):
                await _refuse(send, 431, ERR_HEADERS_TOO_LARGE)
            elif scope["path"] in MCP_PATHS:
                await self.mcp(scope, receive, send)
            else:
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
                self.pool()
                # MCP tools run on anyio's worker threads (the SDK's and
                # pippa_mcp.server's): at most this many at once per process, so
                # a burst of tool calls leaves the pages their share of the
                # interpreter; the calls past it wait as coroutines.
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
            if self._pool is not None:
                await sync_to_async(self._pool.shutdown, thread_sensitive=False)()
                self._pool = None
        await send({"type": "lifespan.shutdown.complete"})


application = Site()
