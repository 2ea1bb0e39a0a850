"""The token pages (``tokens:list``, ``tokens:new``, ``tokens:revoke``,
``tokens:revoke_grant``)."""

from __future__ import annotations

from django.urls import path

from api import views

app_name = "tokens"

urlpatterns = [
    path("", views.token_list, name="list"),
    path("new/", views.token_new, name="new"),
    path("<int:token_id>/revoke/", views.token_revoke_view, name="revoke"),
    path(
        "sign-ins/<int:grant_id>/revoke/",
        views.grant_revoke_view,
        name="revoke_grant",
    ),
]
