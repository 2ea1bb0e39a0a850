from __future__ import annotations

from django.urls import path

from artifacts import views

app_name = "artifacts"
urlpatterns = [
    path("<int:artifact_id>/", views.artifact_detail, name="detail"),
    path("<int:artifact_id>/source", views.artifact_source, name="source"),
    path(
        "<int:artifact_id>/source/text", views.artifact_source_text, name="source_text"
    ),
    path("<int:artifact_id>/preview.png", views.artifact_preview, name="preview"),
    path("<int:artifact_id>/verify", views.artifact_verify_view, name="verify"),
]
