"""Response compression for text only.

Pages, fragments and JSON compress well and are sent often (a live task page
polls); PNG previews and other payloads are already compressed or are bytes
the client downloads as they are, and their strong ETag must stay strong so a
repeat view is a plain 304.
"""

from __future__ import annotations

from django.http import FileResponse, HttpRequest, HttpResponse
from django.middleware.gzip import GZipMiddleware

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
