from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from pippa_mcp.views import mcp_endpoint
from pippa_site import views as site_views
from pippa_site.api import api

token_patterns = (
    [
        path("", site_views.token_list, name="list"),
        path("new/", site_views.token_new, name="new"),
        path("<int:token_id>/revoke/", site_views.token_revoke_view, name="revoke"),
    ],
    "tokens",
)

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("artifacts/", include("artifacts.urls")),
    path("council/", include("council.urls")),
    path("api/v1/", api.urls),
    # Streamable HTTP MCP; both spellings, since a POST cannot follow a slash redirect.
    path("mcp/", mcp_endpoint, name="mcp"),
    path("mcp", mcp_endpoint),
    path("settings/tokens/", include(token_patterns)),
    path("", include("tasks.urls")),
]
