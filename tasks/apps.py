from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
