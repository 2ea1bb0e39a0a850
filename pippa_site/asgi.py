"""The site as one ASGI application: Django for pages, admin and API, the
official MCP SDK's streamable HTTP app at ``/mcp/``.

``make run`` serves it with gunicorn's uvicorn workers
(``pippa_site/gunicorn_conf.py``), ``make dev`` with ``uvicorn --reload``.
A small router sends ``/mcp`` and ``/mcp/`` to ``pippa_mcp.asgi`` and
everything else to Django; the ASGI lifespan starts the SDK's session manager
and the pool of threads Django's synchronous code runs on
(``pippa_site.sync_pool``), and stops both.

Under Django (``DjangoApp``): a request's body is read on the event loop, then
the request borrows a pool thread, on which Django's synchronous handler runs
whole, as under a threaded WSGI server (signals, middleware, view, the answer
read and closed), and gives it back before its answer is sent; a streamed
answer larger than ``SMALL_STREAM_BYTES`` (a blob download) is read chunk by
chunk from a worker thread instead of whole into memory. A body larger than a
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
import sys
import tempfile
from contextlib import closing
from typing import Any

import anyio.to_thread
import django
from asgiref.sync import sync_to_async

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.http import FileResponse  # noqa: E402

from pippa_mcp.asgi import MCPApp  # noqa: E402
from pippa_site import throttle  # noqa: E402
from pippa_site.bearer import bearer_token, bearer_user  # noqa: E402
from pippa_site.sync_pool import SyncPool  # noqa: E402

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
# A larger streamed answer is sent in chunks of this size.
STREAM_CHUNK_BYTES = 2**16


class DjangoApp:
    """Django's synchronous handler, whole, on one pool thread a request.

    The body is read here on the event loop (a client trickling it holds no
    thread); then one hop to a pool thread runs Django's ``WSGIHandler`` as a
    threaded WSGI server would (``request_started``, the middleware chain and
    the view, the answer read and closed, ``request_finished``), and the
    answer is sent from the loop (a slow reader holds no thread either).
    Django's own ``ASGIHandler`` hops between the loop and a thread three times
    a request (the ``request_started`` signal, the chain and view, the
    answer's close); one hop costs the site about half a millisecond of CPU
    less a request (docs/serving-and-bench.md).
    """

    def __init__(self, site: Site) -> None:
        self.site = site
        self.handler = WSGIHandler()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP only, not {scope['type']}")
        kind = _body_kind(scope)
        if kind == TOO_LARGE:
            await _refuse(send, 413, ERR_BODY_TOO_LARGE)
            return
        if kind == LARGE_UPLOAD and not await self._upload_allowed(scope, send):
            return
        body = await _read_body(receive, _body_limit(kind))
        if body is None:
            return  # the client left before its body was in
        if body is TOO_LARGE:  # sent in chunks, with no length to refuse it by
            await _refuse(send, 413, ERR_BODY_TOO_LARGE)
            return
        with closing(body):
            status, headers, content, stream = await self.site.pool().run(
                self._respond, _environ(scope, body)
            )
            await send(
                {"type": "http.response.start", "status": status, "headers": headers}
            )
            if stream is None:
                await send({"type": "http.response.body", "body": content})
            else:
                await _send_stream(stream, receive, send)

    def _respond(self, environ: dict[str, Any]):
        """On the pool thread: (status, headers, content, None) or a stream.

        A whole answer, or a streamed one small enough (a static file, a
        preview), is read and closed here; a larger stream (a blob download)
        comes back to be read a chunk at a time and closed once sent.
        """
        started: list[tuple[str, list[tuple[str, str]]]] = []
        response = self.handler(
            environ,
            lambda status, headers, exc_info=None: started.append((status, headers)),
        )
        status, headers = started[0]
        code = int(status[:3])
        raw = [
            (name.encode("latin-1"), value.encode("latin-1")) for name, value in headers
        ]
        if response.streaming:
            length = _declared_length(response)
            if length is None or length > SMALL_STREAM_BYTES:
                if isinstance(response, FileResponse):
                    response.block_size = STREAM_CHUNK_BYTES
                return code, raw, None, response
        try:
            return code, raw, b"".join(response), None
        finally:
            response.close()

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


async def _read_body(receive, limit: int):
    """The request's body, in memory up to ``FILE_UPLOAD_MAX_MEMORY_SIZE``, then
    in a temporary file written from a worker thread; None if the client left,
    ``TOO_LARGE`` past ``limit`` (a body sent in chunks declares no length)."""
    memory = settings.FILE_UPLOAD_MAX_MEMORY_SIZE
    # Returned to the caller, which closes it.
    body = tempfile.SpooledTemporaryFile(max_size=memory, mode="w+b")  # noqa: SIM115
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            body.close()
            return None
        if chunk := message.get("body"):
            size += len(chunk)
            if size > limit:
                body.close()
                return TOO_LARGE
            if size > memory:  # on disk, or about to roll over to it
                await asyncio.to_thread(body.write, chunk)
            else:
                body.write(chunk)
        if not message.get("more_body", False):
            body.seek(0)
            return body


def _body_limit(kind: str) -> int:
    """The most a body of this kind may be: an admitted upload's, or a form's."""
    if kind == LARGE_UPLOAD:
        return settings.PIPPA_MAX_UPLOAD_BYTES
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def _environ(scope: dict[str, Any], body) -> dict[str, Any]:
    """The WSGI environ of an ASGI request whose body has been read (PEP 3333).

    Strings are the bytes as latin-1, as PEP 3333 has them, and Django decodes
    them back; ``CONTENT_LENGTH`` is the size of the body read, so a body sent
    in chunks (no Content-Length) reaches the view too.
    """
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client") or ("", 0)
    script_name = scope.get("root_path", "").encode().decode("latin-1")
    environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name,
        "PATH_INFO": scope["path"].encode().decode("latin-1").removeprefix(script_name),
        "QUERY_STRING": scope["query_string"].decode("latin-1"),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1] or 0),
        "REMOTE_ADDR": client[0],
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for name, value in scope.get("headers", []):
        if b"_" in name:
            # X_Forwarded_For would land where X-Forwarded-For does: dropped,
            # as WSGI servers (gunicorn, Django's runserver) drop it.
            continue
        key = name.decode("latin-1").upper().replace("-", "_")
        if key not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
            key = f"HTTP_{key}"
        value = value.decode("latin-1")
        # Repeated fields are joined, as a WSGI server and Django's ASGIRequest do.
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    size = body.seek(0, os.SEEK_END)
    body.seek(0)
    if size or "CONTENT_LENGTH" in environ:
        environ["CONTENT_LENGTH"] = str(size)
    return environ


async def _send_stream(response, receive, send) -> None:
    """Send a large streamed answer a chunk at a time, read in a worker thread;
    stop when the client leaves; close the answer (``request_finished``) last."""
    left = asyncio.ensure_future(receive())  # after the body, only a disconnect
    try:
        chunks = iter(response)
        while (chunk := await asyncio.to_thread(next, chunks, _END)) is not _END:
            if left.done():
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body"})
    finally:
        left.cancel()
        await asyncio.to_thread(response.close)


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
        self.django = DjangoApp(self)
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
