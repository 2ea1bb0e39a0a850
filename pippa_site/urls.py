"""The site's addresses: each app's own, included by module name.

The ground imports no app (the import contract in pyproject.toml): every
app's patterns are named here as a string and live in the app.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("artifacts/", include("artifacts.urls")),
    path("council/", include("council.urls")),
    # The JSON API, the OAuth metadata and endpoints, /metrics.
    path("", include("api.site_urls")),
    # Streamable HTTP MCP (answered by pippa_site.asgi before Django).
    path("", include("pippa_mcp.urls")),
    path("settings/tokens/", include("api.urls")),
    path("settings/notifications/", include("notifications.urls")),
    path("", include("dashboard.urls")),
]
