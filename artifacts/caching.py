"""HTTP caching of content-addressed responses.

A payload's URL always answers the same bytes for a given sha256, so the sha is
its ETag and a browser may keep it for a year without asking again
(``immutable``). When it does ask (a reload, a cleared cache), a matching
``If-None-Match`` is answered 304 without opening the blob. The owner check
runs first in every view: a 304 says "your copy is current", which is
information too, so another user still gets 404.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseNotModified
from django.utils.http import parse_etags

IMMUTABLE = "private, max-age=31536000, immutable"


def etag_of(sha256: str) -> str:
    return f'"{sha256}"'


def immutable(response: HttpResponse, *, sha256: str) -> HttpResponse:
    """Mark ``response`` as the bytes of ``sha256``, cacheable for good by its user."""
    response["ETag"] = etag_of(sha256)
    response["Cache-Control"] = IMMUTABLE
    return response


def not_modified(request: HttpRequest, *, sha256: str) -> HttpResponse | None:
    """Return a 304 when the client already holds ``sha256``; None otherwise.

    Weak comparison (RFC 9110 13.1.2): a ``W/`` prefix is ignored, so a copy
    that went through a compressing proxy still matches.
    """
    header = request.headers.get("If-None-Match")
    if not header:
        return None
    wanted = etag_of(sha256)
    for etag in parse_etags(header):
        if etag == "*" or etag.removeprefix("W/") == wanted:
            return immutable(HttpResponseNotModified(), sha256=sha256)
    return None
