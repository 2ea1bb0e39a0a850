"""The authorization server's endpoints (``oauth:authorize`` and the rest)."""

from __future__ import annotations

from django.urls import path

from api import oauth_views

app_name = "oauth"

urlpatterns = [
    path("authorize/", oauth_views.authorize, name="authorize"),
    path("token/", oauth_views.token, name="token"),
    path("register/", oauth_views.register, name="register"),
    path("revoke/", oauth_views.revoke, name="revoke"),
    path("consent/", oauth_views.consent, name="consent"),
]
