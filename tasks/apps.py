from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.contrib.auth.signals import user_logged_in
from django.db.models.signals import pre_delete


class TasksConfig(AppConfig):
    name = "tasks"

    def ready(self) -> None:
        # Models, and the modules that import them, load only once apps are ready.
        from tasks.demo import live_task_on_login
        from tasks.keeping import keepers_register
        from tasks.signals import user_conversations_delete

        keepers_register()
        pre_delete.connect(
            user_conversations_delete,
            sender=settings.AUTH_USER_MODEL,
            dispatch_uid="tasks.user_conversations_delete",
        )
        user_logged_in.connect(
            live_task_on_login, dispatch_uid="tasks.demo.live_task_on_login"
        )
