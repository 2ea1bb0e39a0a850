"""Streamable HTTP at ``/mcp/``: the SDK's ASGI transport, served from a WSGI view.

The site runs under WSGI (runserver, gunicorn, the test live server), while
the SDK's HTTP side is an ASGI app. Each request is handed to a fresh
*stateless* ``StreamableHTTPSessionManager`` running on its own event loop in
a thread; what the ASGI app sends is passed through a queue to a
``StreamingHttpResponse``, so server-sent events (progress notifications of a
long step, then the result) reach the client as they happen. Nothing is kept
between requests: any worker process can answer any request, and a killed
server loses nothing but the call in flight (the executor's own state decides
what happens to that step). docs/mcp.md explains the choice.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from pippa_mcp.server import acting_as, build_server

log = logging.getLogger("pippa.mcp")

ERR_AUTH = "missing, unknown or revoked API token (send Authorization: Bearer <token>)"
ERR_TOO_LARGE = "request body too large"
ERR_INTERNAL = "the MCP server could not answer this request"
# Hop-by-hop headers belong to the connection, which the WSGI server owns.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# How long to wait for the SDK to start its answer; a tool call streams after that.
START_TIMEOUT = 600.0

_server = None
_server_lock = threading.Lock()


def _mcp_server():
    global _server
    with _server_lock:
        if _server is None:
            _server = build_server()
        return _server


def _error(status: int, message: str) -> HttpResponse:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    response = HttpResponse(
        json.dumps(body), status=status, content_type="application/json"
    )
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="pippa"'
    return response


def _bearer_user(request: HttpRequest):
    from api.services import token_authenticate

    header = request.headers.get("Authorization", "")
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return None
    return token_authenticate(raw=raw.strip())


def _scope(request: HttpRequest) -> dict[str, Any]:
    host = request.get_host()  # validates Host against ALLOWED_HOSTS
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1", "replace"))
        for name, value in request.headers.items()
        if name.lower() != "authorization"
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode("utf-8"),
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        "root_path": "",
        "headers": headers,
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
        "server": (host.rsplit(":", 1)[0], int(request.get_port() or 80)),
    }


class _Exchange:
    """One HTTP request run through the SDK's ASGI app on a private event loop."""

    def __init__(self, scope: dict[str, Any], body: bytes, user):
        self.scope = scope
        self.body = body
        self.user = user
        self.messages: queue.Queue = queue.Queue()
        self.body_sent = False
        self.token = None
        self.disconnected: anyio.Event | None = None
        self.thread = threading.Thread(
            target=self._run, name="pippa-mcp-http", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            with acting_as(self.user):
                anyio.run(self._main)
        except BaseException:  # noqa: BLE001 - reported to the waiting view
            log.exception("MCP request failed")
        finally:
            self.messages.put(None)

    async def _main(self) -> None:
        self.token = anyio.lowlevel.current_token()
        self.disconnected = anyio.Event()
        manager = StreamableHTTPSessionManager(
            app=_mcp_server()._lowlevel_server, stateless=True, json_response=False
        )
        async with manager.run():
            await manager.handle_request(self.scope, self._receive, self._send)

    async def _receive(self) -> dict[str, Any]:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        self.messages.put(message)

    def disconnect(self) -> None:
        """The client went away (or the response ended): let the ASGI side stop."""
        if self.token is None or not self.thread.is_alive():
            return
        try:
            anyio.from_thread.run_sync(self.disconnected.set, token=self.token)
        except RuntimeError:
            pass  # the loop has already finished

    def body_chunks(self):
        try:
            while True:
                message = self.messages.get()
                if message is None:
                    return
                if message["type"] != "http.response.body":
                    continue
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    return
        finally:
            self.disconnect()


@csrf_exempt
def mcp_endpoint(request: HttpRequest) -> HttpResponse:
    """The MCP endpoint (streamable HTTP, stateless), authenticated by bearer token."""
    user = _bearer_user(request)
    if user is None:
        return _error(401, ERR_AUTH)
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, ERR_TOO_LARGE)
    exchange = _Exchange(_scope(request), body, user)
    exchange.start()
    try:
        start = exchange.messages.get(timeout=START_TIMEOUT)
    except queue.Empty:
        exchange.disconnect()
        return _error(503, ERR_INTERNAL)
    if start is None or start["type"] != "http.response.start":
        return _error(500, ERR_INTERNAL)
    response = StreamingHttpResponse(exchange.body_chunks(), status=start["status"])
    for name, value in start.get("headers", []):
        key = name.decode("latin-1")
        if key.lower() in HOP_BY_HOP:
            continue
        response[key] = value.decode("latin-1")
    # Server-sent events must reach the client as they are written.
    response["X-Accel-Buffering"] = "no"
    return response
