from __future__ import annotations

from django.urls import path

from notifications import views

urlpatterns = [
    path("", views.notify_settings, name="notify_settings"),
]
