"""Builders for dashboard tests: tasks with steps, outputs and events."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from tasks.models import Event, Step, Task

TOOLS = {
    ArtifactClass.FILE: "image_write",
    ArtifactClass.FETCH: "daily_closes",
    ArtifactClass.SNAPSHOT: "web_search",
    ArtifactClass.RENDER: "chart_render",
}


def add_steps(
    task: Task,
    count: int,
    *,
    done: int = 0,
    status: str = Step.Status.PENDING,
    artifact_class: int = ArtifactClass.SNAPSHOT,
    payload: bytes | None = None,
    media_type: str = "text/plain",
) -> list[Step]:
    """Add ``count`` steps; the first ``done`` are done with a text output."""
    now = timezone.now()
    first = task.steps.count() + 1
    steps = []
    for i in range(count):
        position = first + i
        is_done = i < done
        output = None
        if is_done:
            output = artifact_store(
                data=payload or f"result of step {position}\n".encode(),
                media_type=media_type,
                artifact_class=artifact_class,
                title=f"output {task.pk}-{position}",
            )
        steps.append(
            Step(
                task=task,
                position=position,
                title=f"Step number {position}",
                tool=TOOLS[ArtifactClass(artifact_class)],
                artifact_class=artifact_class,
                status=Step.Status.DONE if is_done else status,
                attempts=1 if is_done else 0,
                output=output,
                started_at=now - timedelta(seconds=3) if is_done else None,
                finished_at=now - timedelta(seconds=1) if is_done else None,
            )
        )
    Step.objects.bulk_create(steps)
    Task.objects.filter(pk=task.pk).update(
        steps_total=task.steps_total + count, steps_done=task.steps_done + done
    )
    task.refresh_from_db()
    return list(task.steps.order_by("position"))


def add_events(
    task: Task, count: int, *, kind: str = "lease_renewed", step=None
) -> None:
    """Append ``count`` events in bulk (the seq counter moves as event_append's)."""
    start = task.last_seq
    Event.objects.bulk_create(
        [
            Event(task=task, step=step, seq=start + i + 1, kind=kind, data={"i": i})
            for i in range(count)
        ]
    )
    Task.objects.filter(pk=task.pk).update(last_seq=start + count)
    task.refresh_from_db()
