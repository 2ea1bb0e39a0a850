"""``/mcp/`` under a WSGI server (``manage.py runserver``, Django's test live server).

MCP over HTTP is served natively by the ASGI application (``pippa_site.asgi``,
which routes ``/mcp/`` to ``pippa_mcp.asgi`` before Django sees it); ``make run``
and ``make dev`` serve that. A WSGI server reaching this view says so instead
of answering half the protocol.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

ERR_NOT_ASGI = (
    "MCP over HTTP is served by the ASGI application (pippa_site.asgi: make run, "
    "make dev); this server speaks WSGI"
)


@csrf_exempt
def mcp_endpoint(request: HttpRequest) -> JsonResponse:
    """Answer 501: the streamable HTTP transport lives in the ASGI app."""
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32601, "message": ERR_NOT_ASGI},
    }
    return JsonResponse(body, status=501)
