from __future__ import annotations

from django.urls import path

from notifications import views

urlpatterns = [
    path("", views.notify_settings, name="notify_settings"),
    path("test/", views.notify_settings_test, name="notify_settings_test"),
    path("off/<str:token>/", views.notify_off, name="notify_off"),
]
