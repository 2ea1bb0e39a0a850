"""The JSON API's addresses at the site's root (``pippa_site.urls`` includes them).

The API itself under ``/api/v1/`` (anything else under ``/api/`` answers in
the API's own JSON 404), the OAuth metadata and endpoints MCP clients sign in
with (``api.oauth``), and the Prometheus scrape (``api.metrics``).
"""

from __future__ import annotations

from django.urls import include, path, re_path

from api import oauth_views
from api import views as api_views
from api.api import api
from api.metrics import metrics_view

urlpatterns = [
    path("api/v1/", api.urls),
    # MCP clients sign in here (api.oauth): RFC 9728 metadata for /mcp/ (at
    # the path-inserted address and the bare one), RFC 8414 metadata, and the
    # authorization server's endpoints.
    re_path(
        r"^\.well-known/oauth-protected-resource(?:/mcp/?)?$",
        oauth_views.protected_resource,
        name="oauth_protected_resource",
    ),
    path(
        ".well-known/oauth-authorization-server",
        oauth_views.authorization_server,
        name="oauth_authorization_server",
    ),
    path("oauth/", include("api.oauth_urls")),
    # Anything else under the API answers in the API's own words (JSON 404).
    re_path(r"^api/", api_views.api_not_found),
    # Prometheus: staff, or a scraper with PIPPA_METRICS_TOKEN (api.metrics).
    path("metrics", metrics_view, name="metrics"),
]
