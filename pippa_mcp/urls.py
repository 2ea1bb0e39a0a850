"""``/mcp`` and ``/mcp/`` as Django sees them (``pippa_site.urls`` includes them).

``pippa_site.asgi`` routes both spellings to the SDK's transport before
Django; a WSGI server reaching these says so (501, ``pippa_mcp.views``).
"""

from __future__ import annotations

from django.urls import path

from pippa_mcp.views import mcp_endpoint

urlpatterns = [
    path("mcp/", mcp_endpoint, name="mcp"),
    path("mcp", mcp_endpoint),
]
