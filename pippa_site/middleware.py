"""Site middleware: request timing, response compression for text only, the
text guard, and the session cookie guard.

Timing: ``RequestMetricsMiddleware``, outermost, records how long each request
took by door (``pippa_site.metrics``): dashboard, admin, api, mcp (MCP over
HTTP is timed by ``pippa_mcp.asgi``, which answers it before Django).

Compression: pages, fragments and JSON compress well and are sent often (a live
task page polls); PNG previews and other payloads are already compressed or are
bytes the client downloads as they are, and their strong ETag must stay strong
so a repeat view is a plain 304.

Text guard: refuse text no database here can store, at the door, for every
page. ``pippa_site.text`` holds the rule; ``TextGuardMiddleware`` applies it to
what every request carries as text: the path, the query string and form
fields. The JSON API's bodies are checked by its schemas with the same rule. A
refusal is a 400 that says why (JSON under /api/), the same on SQLite and
PostgreSQL, instead of a 500 on one and stored bytes on the other.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.sessions.backends.base import VALID_KEY_CHARS
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.middleware.gzip import GZipMiddleware

from pippa_site import metrics
from pippa_site.text import ERR_BAD_TEXT, text_refused


def door_of(path: str) -> str | None:
    """The door a request came through, by its path; None for what is not a
    door (static files, the metrics themselves)."""
    if path.startswith("/api/"):
        return "api"
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/mcp"):
        return "mcp"
    if path.startswith(f"/{settings.STATIC_URL.strip('/')}/") or path == "/metrics":
        return None
    return "dashboard"


class RequestMetricsMiddleware:
    """Time every request by door, once its response is made (a streamed
    body's sending is the server's, not counted)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        door = door_of(request.path)
        if door is not None:
            metrics.request_observed(
                door=door,
                status=response.status_code,
                seconds=time.perf_counter() - started,
            )
        return response


COMPRESSIBLE_TYPES = (
    "text/html",
    "application/json",
    "text/css",
    "text/javascript",
    "application/javascript",
)


class TextGZipMiddleware(GZipMiddleware):
    """Django's GZipMiddleware (with its BREACH padding), for text, never payload files."""

    def process_response(
        self, request: HttpRequest, response: HttpResponse
    ) -> HttpResponse:
        if isinstance(response, FileResponse):
            return response
        content_type = response.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type not in COMPRESSIBLE_TYPES:
            return response
        return super().process_response(request, response)


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _refused_field(request: HttpRequest) -> str | None:
    if text_refused(request.path):
        return "the address"
    for key, values in request.GET.lists():
        if text_refused(key) or any(text_refused(v) for v in values):
            return f"query parameter {key!r}"
    # The API takes no forms (its bodies are checked by its schemas), and its
    # upload must be refused before a byte of the body is read.
    if (
        request.method == "POST"
        and request.content_type in FORM_TYPES
        and not request.path.startswith("/api/")
    ):
        for key, values in request.POST.lists():
            if text_refused(key) or any(
                isinstance(v, str) and text_refused(v) for v in values
            ):
                return f"form field {key!r}"
    return None


class TextGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        field = _refused_field(request)
        if field is None:
            return self.get_response(request)
        message = ERR_BAD_TEXT.format(field=field.capitalize())
        if request.path.startswith("/api/"):
            return JsonResponse({"detail": message}, status=400)
        return HttpResponse(message, status=400, content_type="text/plain")


_KEY_CHARS = frozenset(VALID_KEY_CHARS)


class SessionCookieGuardMiddleware:
    """Drop a session cookie that no session key could be, before
    ``SessionMiddleware`` looks it up.

    Django makes session keys of ``VALID_KEY_CHARS`` only; a forged cookie
    with anything else (a NUL, which PostgreSQL refuses with an error rather
    than finding no row) names no session, on every database alike.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        name = settings.SESSION_COOKIE_NAME
        key = request.COOKIES.get(name)
        if key is not None and not set(key) <= _KEY_CHARS:
            del request.COOKIES[name]
        return self.get_response(request)
