from __future__ import annotations

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"

    def ready(self) -> None:
        # The tasks app names no app above it: it sends signals
        # (tasks.hooks), and the outbox listens.
        from notifications.outbox import connect

        connect()
