"""What tasks keep: task links and step outputs, told to ``artifacts.keepers``.

``keepers_register`` runs from ``TasksConfig.ready()``. The artifact rule, the
artifact's page and the admin read these through the registry; the words
for people live here, beside the tables they describe.
"""

from __future__ import annotations

from artifacts.keepers import Keeper, OwnerLink, note_register, register
from tasks.models import Event, Step, Task, TaskArtifact
from tasks.services import event_append

REASON_SHARED_TASK = "shared with task “{task}” in “{conversation}”"
REASON_SHARED_STEP = "output of a step of task “{task}” in “{conversation}”"
REASON_DANGLING = (
    "still linked from task {task}, which no longer exists "
    "(pippa_doctor --repair clears such links)"
)
MAX_LINES = 20


def _tasks_named(ids: list[int], words: str) -> dict[int, str]:
    """Why each task keeps an artifact in a delete's preview (gone ones too)."""
    rows = Task.objects.filter(pk__in=ids).values_list(
        "pk", "title", "conversation__title"
    )
    named = {
        pk: words.format(task=title, conversation=conv) for pk, title, conv in rows
    }
    return {pk: named.get(pk) or REASON_DANGLING.format(task=pk) for pk in ids}


def _link_lines(artifact) -> list[str]:
    links = (
        TaskArtifact.objects.filter(artifact=artifact)
        .select_related("task")
        .order_by("task_id")[:MAX_LINES]
    )
    return [f"{link.role} by task {link.task_id} “{link.task.title}”" for link in links]


def _output_lines(artifact) -> list[str]:
    steps = Step.objects.filter(output=artifact).values_list("task_id", "position")
    return [f"output of task {t} step {p}" for t, p in steps[:MAX_LINES]]


def task_owners(artifact, user, staff: bool = False) -> list[OwnerLink]:
    """The tasks that link or output ``artifact``, each once, as ``user`` sees
    them (every one to staff with ``staff``, as the artifact's page passes)."""
    links = (
        TaskArtifact.objects.for_user(user, staff=staff)
        .filter(artifact=artifact)
        .select_related("task", "task__conversation")
    )
    outputs = (
        Step.objects.for_user(user, staff=staff)
        .filter(output=artifact)
        .select_related("task", "task__conversation")
    )
    owners: list[OwnerLink] = []
    seen: set[int] = set()
    for link in links.order_by("task_id", "role"):
        owners.append(OwnerLink("task", link.role, link.task))
        seen.add(link.task_id)
    for step in outputs.order_by("task_id", "position"):
        if step.task_id not in seen:
            owners.append(OwnerLink("task", "step output", step.task))
            seen.add(step.task_id)
    return owners


def _note_on_tasks(*, artifact, actor: str, action: str, **data) -> None:
    """Append an admin_action event to every task that keeps the artifact."""
    task_ids = set(
        TaskArtifact.objects.filter(artifact=artifact).values_list("task_id", flat=True)
    ) | set(Step.objects.filter(output=artifact).values_list("task_id", flat=True))
    for task_id in sorted(task_ids):
        event_append(
            task_id=task_id,
            kind=Event.Kind.ADMIN_ACTION,
            data={"action": action, "actor": actor, "artifact_id": artifact.pk, **data},
        )


def keepers_register() -> None:
    register(
        Keeper(
            name="task_link",
            model=TaskArtifact,
            artifact="artifact",
            parent="task",
            conversation="task__conversation",
            noun="task",
            shared=lambda ids: _tasks_named(ids, REASON_SHARED_TASK),
            kept_by=_link_lines,
            owners=task_owners,
        )
    )
    register(
        Keeper(
            name="step_output",
            model=Step,
            artifact="output",
            parent="task",
            conversation="task__conversation",
            noun="task",
            shared=lambda ids: _tasks_named(ids, REASON_SHARED_STEP),
            kept_by=_output_lines,
        )
    )
    note_register(_note_on_tasks)
