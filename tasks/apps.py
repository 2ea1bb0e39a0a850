from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import pre_delete


class TasksConfig(AppConfig):
    name = "tasks"

    def ready(self) -> None:
        # Models and the modules that import them load only once apps are ready.
        from artifacts.keepers import Keeper, register
        from tasks.models import Step, TaskArtifact
        from tasks.signals import user_conversations_delete

        register(
            Keeper(
                name="task_link",
                model=TaskArtifact,
                artifact="artifact",
                parent="task",
                conversation="task__conversation",
                shared="shared with task {parent} in another conversation",
            )
        )
        register(
            Keeper(
                name="step_output",
                model=Step,
                artifact="output",
                parent="task",
                conversation="task__conversation",
                shared="output of a step of task {parent} in another conversation",
            )
        )
        pre_delete.connect(
            user_conversations_delete,
            sender=settings.AUTH_USER_MODEL,
            dispatch_uid="tasks.user_conversations_delete",
        )
