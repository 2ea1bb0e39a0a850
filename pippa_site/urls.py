from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from api import oauth_views
from api import views as api_views
from api.api import api
from api.metrics import metrics_view
from pippa_mcp.views import mcp_endpoint

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("artifacts/", include("artifacts.urls")),
    path("council/", include("council.urls")),
    path("api/v1/", api.urls),
    # Streamable HTTP MCP: pippa_site.asgi routes both spellings to the SDK's
    # transport before Django; a WSGI server reaching these says so (501).
    path("mcp/", mcp_endpoint, name="mcp"),
    path("mcp", mcp_endpoint),
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
    path("settings/tokens/", include("api.urls")),
    # Prometheus: staff, or a scraper with PIPPA_METRICS_TOKEN (api.metrics).
    path("metrics", metrics_view, name="metrics"),
    path("settings/notifications/", include("notifications.urls")),
    path("", include("dashboard.urls")),
]
