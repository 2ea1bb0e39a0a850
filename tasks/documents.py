"""The documents a program reads: owner-checked reads, built in the shapes of
``tasks.shapes``.

The doors for programs (the JSON API, the MCP server, the brain runner's
in-process backend) all use these, so a brain sees the same documents
whichever way it is connected. Another user's object is reported exactly like
a missing one (``NotFound``, a 404). The dashboard reads conversations and tasks through
the same two getters, passing ``staff=staff_reads(request)`` on a page that
reads (``pippa_site.owners``: staff see every row there); a page that writes
and a program's door never do.
"""

from __future__ import annotations

from typing import Any

from artifacts.models import Artifact
from artifacts.selectors import artifact_get_for_user
from pippa_site.errors import NotFound
from pippa_site.owners import user_sees_row
from tasks.models import Conversation, Step, Task
from tasks.shapes import (
    ArtifactOut,
    ArtifactRefOut,
    ConversationOut,
    StepCompleteOut,
    StepOut,
    StepRunOut,
    TaskOut,
    TaskSummaryOut,
)

ERR_NO_CONVERSATION = "conversation {id} not found (or not yours)"
ERR_NO_TASK = "task {id} not found (or not yours)"
ERR_NO_ARTIFACT = "artifact {id} not found (or not yours)"


def conversation_get_for_user(
    *, user, conversation_id: int, staff: bool = False
) -> Conversation:
    """Return the conversation if ``user`` may see it (``pippa_site.owners``:
    their own; every one to staff only with ``staff=True``); else NotFound."""
    return Conversation.objects.select_related("owner").get_for_user(
        user,
        conversation_id,
        staff=staff,
        error=ERR_NO_CONVERSATION.format(id=conversation_id),
    )


def task_get_for_user(*, user, task_id: int, staff: bool = False) -> Task:
    """Return the task, with its conversation, if ``user`` may see the
    conversation (as ``conversation_get_for_user``); else NotFound.

    Every request of every door that names a task starts here (a dashboard
    tab's poll every 2 s among them): one query for the task and its
    conversation, and the owner rule on the row in hand (``user_sees_row``).
    """
    try:
        pk = int(task_id)
    except (TypeError, ValueError):
        raise NotFound(ERR_NO_TASK.format(id=task_id)) from None
    task = Task.objects.select_related("conversation").filter(pk=pk).first()
    if task is None or not user_sees_row(user, task.conversation.owner_id, staff=staff):
        raise NotFound(ERR_NO_TASK.format(id=task_id))
    return task


def artifact_get(*, user, artifact_id: int) -> Artifact:
    """The user's own artifact (staff too see only their own), with an API-worded 404."""
    try:
        return artifact_get_for_user(user=user, artifact_id=artifact_id)
    except NotFound:
        raise NotFound(ERR_NO_ARTIFACT.format(id=artifact_id)) from None


def artifacts_get(*, user, artifact_ids) -> list[Artifact]:
    """Each named artifact, once, in order; one the user may not read is a 404."""
    return [
        artifact_get(user=user, artifact_id=artifact_id)
        for artifact_id in dict.fromkeys(artifact_ids)
    ]


# -- the shapes: one artifact ref, one step, one task --------------------------
# Defined once, in tasks.shapes (the API's response schemas). Every door that
# shows a program these rows builds them here, through those classes: the task
# document (the API, MCP's get_task), the resume context (tasks.resume), the
# council's refs (council.services) and MCP's task list. A ``*_document`` is the
# model, which the API answers with as it is (validated once); a ``*_payload``
# is its dict, for the doors that send dicts.


def artifact_ref(artifact: Artifact) -> dict[str, Any]:
    """The ref of an artifact a program reads (``ArtifactRefOut``)."""
    return ArtifactRefOut.model_validate(artifact).model_dump()


def artifact_content_url(artifact_id: int) -> str:
    """Where a bearer token reads an artifact's bytes: the JSON API's address."""
    return f"/api/v1/artifacts/{artifact_id}/content"


def artifact_document(artifact: Artifact) -> ArtifactOut:
    """An artifact's ref, its sources' ids and where its bytes are."""
    return ArtifactOut(
        **artifact_ref(artifact),
        source_refs=list(
            artifact.source_links.order_by("position", "id").values_list(
                "source_id", flat=True
            )
        ),
        created_at=artifact.created_at,
        content_url=artifact_content_url(artifact.pk),
    )


def artifact_payload(artifact: Artifact) -> dict[str, Any]:
    return artifact_document(artifact).model_dump()


def step_payload(step: Step) -> dict[str, Any]:
    """A step of a plan: what it runs, its class, where it stands, its output's ref."""
    return StepOut.model_validate(step).model_dump()


def task_summary(task: Task) -> dict[str, Any]:
    """A task without its steps: status and progress (a task list's row)."""
    return TaskSummaryOut.model_validate(task).model_dump()


def task_steps(task: Task) -> list[Step]:
    """The task's steps in order, each with its output row joined."""
    return list(task.steps.select_related("output").order_by("position"))


def task_document(task: Task) -> TaskOut:
    """The task as it is in the database now, with its steps in order."""
    task.refresh_from_db()
    return TaskOut(
        **task_summary(task),
        steps=[StepOut.model_validate(s) for s in task_steps(task)],
    )


def task_payload(task: Task) -> dict[str, Any]:
    return task_document(task).model_dump()


def step_run_document(run, task: Task) -> StepRunOut:
    """What a runner is told after asking for a step (``tasks.actions.StepRun``)."""
    return StepRunOut(
        ran=run.ran,
        detail=run.detail,
        invoked=run.invoked,
        rule=run.rule,
        step=None if run.step is None else StepOut.model_validate(run.step),
        task=task_document(task),
    )


def step_run_payload(run, task: Task) -> dict[str, Any]:
    return step_run_document(run, task).model_dump()


def step_complete_document(completion, task: Task) -> StepCompleteOut:
    """What an agent is told after ``complete_step`` (``tasks.actions.StepCompletion``)."""
    task.refresh_from_db()
    return StepCompleteOut(
        completed=completion.completed,
        already=completion.already,
        detail=completion.detail,
        rule=completion.rule,
        step=StepOut.model_validate(completion.step),
        task=TaskSummaryOut.model_validate(task),
    )


def step_complete_payload(completion, task: Task) -> dict[str, Any]:
    return step_complete_document(completion, task).model_dump(mode="json")


def conversation_document(conversation: Conversation) -> ConversationOut:
    """A conversation and its tasks' ids, oldest first."""
    return ConversationOut(
        id=conversation.pk,
        title=conversation.title,
        created_at=conversation.created_at,
        task_ids=list(
            conversation.tasks.order_by("created_at", "id").values_list("id", flat=True)
        ),
    )


def conversation_payload(conversation: Conversation) -> dict[str, Any]:
    return conversation_document(conversation).model_dump()
