"""Builders for dashboard tests: tasks with steps, outputs and events."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from tasks.models import Event, Step, Task, TaskArtifact

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
                owner=task.conversation.owner_id,
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
    TaskArtifact.objects.bulk_create(
        [
            TaskArtifact(task=task, step=step, artifact=step.output)
            for step in steps
            if step.output is not None
        ],
        ignore_conflicts=True,
    )
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


def png_bytes(width: int = 240, height: int = 140) -> bytes:
    """A small bar chart as PNG (Pillow), for image thumbnails."""
    import io

    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for i, h in enumerate((40, 90, 65, 120, 80)):
        x = 20 + i * 42
        draw.rectangle([x, height - 10 - h, x + 30, height - 10], fill=(47, 95, 208))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


SVG_WIDGET = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100">'
    b'<rect width="200" height="100" fill="#f3e8ff"/>'
    b'<circle cx="50" cy="50" r="30" fill="#7a3fa0"/>'
    b'<text x="95" y="58" font-size="18">widget</text></svg>'
)


def showcase(owner, make_conversation, make_task) -> dict:
    """A conversation with one task of each kind a person meets on the dashboard."""
    from artifacts.preview import preview_render

    conversation = make_conversation(owner=owner, title="Tomato prices this summer")
    running = make_task(
        conversation=conversation,
        title="Chart weekly tomato prices",
        brain="claude",
        status=Task.Status.RUNNING,
        lease_owner="worker:kitchen-pi-4121",
        lease_expires_at=timezone.now() + timedelta(seconds=45),
    )
    add_steps(
        running,
        1,
        done=1,
        artifact_class=ArtifactClass.SNAPSHOT,
        payload=b'{"query": "tomato prices", "results": [{"title": "Market report <b>June</b>", "price": 2.35}]}',
        media_type="application/json",
    )
    add_steps(
        running,
        1,
        done=1,
        artifact_class=ArtifactClass.FETCH,
        payload=b"date,close\n2026-06-01,2.31\n2026-06-08,2.35\n2026-06-15,2.40\n",
        media_type="text/csv",
    )
    add_steps(
        running,
        1,
        done=1,
        artifact_class=ArtifactClass.FILE,
        payload=png_bytes(),
        media_type="image/png",
    )
    widget = add_steps(
        running,
        1,
        done=1,
        artifact_class=ArtifactClass.RENDER,
        payload=SVG_WIDGET,
        media_type="image/svg+xml",
    )[-1]
    preview = preview_render(artifact=widget.output)
    TaskArtifact.objects.create(task=running, step=widget, artifact=preview)
    add_steps(running, 2, status=Step.Status.PENDING)
    Step.objects.filter(task=running, position=5).update(
        status=Step.Status.RUNNING,
        started_at=timezone.now() - timedelta(seconds=4),
        attempts=1,
    )
    add_events(running, 12, kind="tool_call_started")

    review = make_task(
        conversation=conversation,
        title="Email the summary to the family",
        brain="codex",
        status=Task.Status.NEEDS_REVIEW,
    )
    add_steps(review, 1, done=1)
    add_steps(
        review,
        1,
        status=Step.Status.NEEDS_REVIEW,
        artifact_class=ArtifactClass.SNAPSHOT,
    )
    Step.objects.filter(task=review, position=2).update(
        side_effects=True,
        tool="send_email",
        attempts=1,
        title="Send the email",
        error="The tool call started but no result was saved (worker restarted).",
    )
    done = make_task(
        conversation=conversation,
        title="Find three recipes",
        brain="kimi",
        status=Task.Status.DONE,
    )
    add_steps(done, 3, done=3)
    return {
        "conversation": conversation,
        "running": running,
        "review": review,
        "done": done,
    }
