from __future__ import annotations

from django.urls import path

from tasks import views

app_name = "tasks"
urlpatterns = [
    path("", views.conversation_list, name="conversations"),
]
