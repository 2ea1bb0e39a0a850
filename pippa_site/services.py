"""Writes behind the API: tokens (create, revoke, authenticate) and uploads."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from pippa_site.errors import Invalid, LeaseConflict
from pippa_site.models import ApiToken

TOKEN_PREFIX = "pip_"
PREFIX_CHARS = 12
ERR_TOKEN_NAME = "give the token a name (up to 100 characters)"
ERR_TOKEN_REVOKED = "that token is already revoked"


class TokenError(Invalid):
    pass


@dataclass(frozen=True)
class NewToken:
    token: ApiToken
    # The bearer token itself: shown once, never stored.
    raw: str


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def token_create(*, user, name: str) -> NewToken:
    """Create a token for ``user``; return the row and the raw token (shown once)."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise TokenError(ERR_TOKEN_NAME)
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, sha256=token_hash(raw), prefix=raw[:PREFIX_CHARS]
    )
    return NewToken(token=token, raw=raw)


def token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token; it stops working on the next request."""
    updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if not updated:
        raise TokenError(ERR_TOKEN_REVOKED)
    token.refresh_from_db()
    return token


def token_authenticate(*, raw: str):
    """Return the user of an active token, or None. Records when it was last used."""
    if not raw or len(raw) > 200:
        return None
    token = (
        ApiToken.objects.active()
        .select_related("user")
        .filter(sha256=token_hash(raw))
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    # At most one write a minute per token: reads stay reads.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        with transaction.atomic():
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


# -- API writes: each one is all-or-nothing -----------------------------------

ERR_BAD_STEP = "step {id} is not a step of task {task}"
ERR_NOTHING_TO_RUN = "nothing to run: the task is {status}"
ERR_PAUSED = "the task is paused; resume it first (POST /tasks/{id}/resume)"
ERR_ALL_DONE = "every step is finished: the task is {status}"
ERR_BLOCKED = "step {position} is {status}: a person must retry or resolve it"
ERR_LEASE_HELD = (
    "another worker ({owner}) holds the task's lease until {until}; try again later"
)


def door_worker_id(*, door: str, user, worker: str) -> str:
    """The lease name of a runner reaching Pippa through ``door`` (api, mcp).

    The user's name is part of it, so two users' runners never share a lease
    even when they call themselves the same.
    """
    return f"{door}:{user.get_username()}:{worker}"


@dataclass(frozen=True)
class StepRun:
    ran: bool
    detail: str
    step: object | None
    lease_busy: bool = False
    invoked: bool = False
    rule: str = ""


@transaction.atomic
def api_task_create(
    *, conversation, title: str, steps: list[dict], brain: str, queue: bool
):
    from tasks.plan import task_create

    return task_create(
        conversation=conversation, title=title, steps=steps, brain=brain, queue=queue
    )


@transaction.atomic
def api_conversation_task_create(
    *,
    owner,
    conversation_title: str,
    title: str,
    steps: list[dict],
    brain: str,
    queue: bool,
):
    """Create a conversation and its first task; a bad plan leaves neither."""
    from tasks.plan import task_create
    from tasks.services import conversation_create

    conversation = conversation_create(owner=owner, title=conversation_title)
    return task_create(
        conversation=conversation, title=title, steps=steps, brain=brain, queue=queue
    )


@transaction.atomic
def api_plan_rewrite(*, task, steps: list[dict]):
    from tasks.plan import plan_rewrite

    return plan_rewrite(task=task, steps=steps)


@transaction.atomic
def task_brain_record(*, task, brain: str, actor: str = "") -> bool:
    """Set the brain that drives ``task`` and log the change; return if it changed."""
    from tasks.models import Event, Task
    from tasks.services import event_append

    previous = (
        Task.objects.filter(pk=task.pk).values_list("brain", flat=True).first() or ""
    )
    if previous == brain:
        return False
    Task.objects.filter(pk=task.pk).update(brain=brain, updated_at=timezone.now())
    event_append(
        task_id=task.pk,
        kind=Event.Kind.BRAIN_CHANGED,
        data={"brain": brain, "previous": previous, "actor": actor[:200]},
    )
    task.brain = brain
    return True


def api_artifact_upload(
    *,
    task,
    stream,
    media_type: str,
    artifact_class: int,
    title: str = "",
    source_ids=(),
    step_id: int | None = None,
    max_bytes: int | None = None,
):
    """Store an uploaded payload as an artifact that ``task`` persisted.

    1. Check the step belongs to the task, before any I/O.
    2. Stream the body into the blob store (at most one chunk in memory);
       over ``max_bytes`` raises ``BlobTooLarge`` and leaves no blob.
    3. In one transaction: the artifact row (dedup by sha: an existing row is
       reused as it is, lineage included), its lineage and the task link. A failure here leaves at worst an unreferenced blob,
       which the doctor sweeps ("write before show").
    """
    from artifacts.models import Artifact
    from artifacts.services import _check_class, artifact_record, blob_put
    from tasks.models import Step, TaskArtifact

    _check_class(artifact_class)
    if step_id is not None and not Step.objects.filter(pk=step_id, task=task).exists():
        raise UploadError(ERR_BAD_STEP.format(id=step_id, task=task.pk))
    put = blob_put(stream=stream, max_bytes=max_bytes)
    with transaction.atomic():
        # Content addressing: bytes stored before keep their first writer's
        # class, title and lineage; an upload never edits a shared row.
        if Artifact.objects.filter(sha256=put.sha256).exists():
            source_ids = ()
        artifact = artifact_record(
            put=put,
            media_type=media_type,
            artifact_class=artifact_class,
            title=title,
            meta={"uploaded_for_task": task.pk},
            source_ids=source_ids,
        )
        TaskArtifact.objects.get_or_create(
            task=task,
            artifact=artifact,
            role=TaskArtifact.Role.PERSISTED,
            defaults={"step_id": step_id},
        )
    return artifact


class UploadError(Invalid):
    pass


def api_step_run(*, task, worker_id: str) -> StepRun:
    """Ask the executor for one step; return once its result is persisted.

    ``tasks.executor.step`` does the work (lease, envelope, payload, result in
    one transaction). This only explains its answer: a step ran (or an
    uncertain one was resolved), the task is settled or paused, or another
    worker holds the lease right now (``lease_busy``, the caller may wait).
    """
    from tasks.executor import step
    from tasks.models import Step, Task

    outcome = step(task_id=task.pk, worker_id=worker_id)
    task.refresh_from_db()
    if outcome is None:
        if task.status == Task.Status.PAUSED:
            return StepRun(ran=False, detail=ERR_PAUSED.format(id=task.pk), step=None)
        if task.lease_live and task.lease_owner != worker_id:
            until = task.lease_expires_at.isoformat()
            return StepRun(
                ran=False,
                detail=ERR_LEASE_HELD.format(owner=task.lease_owner, until=until),
                step=None,
                lease_busy=True,
            )
        return StepRun(
            ran=False, detail=ERR_NOTHING_TO_RUN.format(status=task.status), step=None
        )
    if outcome.step_id is None:
        return StepRun(
            ran=False, detail=ERR_ALL_DONE.format(status=task.status), step=None
        )
    step_row = Step.objects.select_related("output").get(pk=outcome.step_id)
    ran = bool(outcome.invoked or outcome.rule)
    if ran:
        detail = outcome.error or f"step {step_row.position} is {step_row.status}"
    else:
        detail = outcome.error or ERR_BLOCKED.format(
            position=step_row.position, status=step_row.get_status_display()
        )
    return StepRun(
        ran=ran,
        detail=detail[:2000],
        step=step_row,
        invoked=outcome.invoked,
        rule=outcome.rule,
    )


def api_lease_release(*, task, worker_id: str) -> bool:
    """Release the lease if ``worker_id`` holds it (a runner that stops early)."""
    from tasks.lease import lease_release

    try:
        return lease_release(task=task, actor=worker_id, force=False)
    except LeaseConflict:
        return False
