"""Writes that span tables: conversations, the event log, a task's brain and
uploads, widget previews, deletion."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, Max, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from artifacts.gc import (
    ArtifactRecord,
    artifacts_delete,
    batched,
    blobs_unlink_after_commit,
    gc_plan,
)
from artifacts.keepers import conversation_artifact_ids
from artifacts.models import Artifact, ArtifactClass, PendingUnlink
from artifacts.quota import QuotaExceeded
from artifacts.services import (
    _check_class,
    artifact_record,
    blob_put,
    blob_put_refused,
    sources_check,
)
from artifacts.store import default_store
from pippa_site.errors import Invalid, NotFound
from pippa_site.text import TITLE_MAX, media_type_check, text_check, title_clean
from tasks import statements
from tasks.crashpoints import PREVIEW_BOUNDARY, crashpoint
from tasks.limits import NOTE_MAX_CHARS
from tasks.models import Conversation, Event, Step, Task, TaskArtifact
from tasks.statements import (  # noqa: F401 - the event log's names, re-exported
    ERR_EVENT_DATA_TOO_LARGE,
    MAX_EVENT_DATA_CHARS,
    events_insert,
)
from tasks.tools import task_folders_remove

log = logging.getLogger("pippa.tasks")

ERR_NO_TASK = "no such task"


class TaskNotFound(NotFound):
    pass


def task_widget_preview(
    *, artifact_id: int, task_id: int, step_id: int | None = None
) -> Artifact | None:
    """Render a widget's PNG preview after its row committed; the task keeps it.

    The executor (a step's widget output) and the API (an uploaded widget)
    both call this, and the council's ``widget_store`` calls the same
    ``preview_render``. A preview is a view of the widget, never part of it:
    it fails closed (``preview_render`` records the reason on the widget).
    The preview's row, the widget's record of it and this task's keeper link
    commit in one transaction (the crash point ``before_preview_commit`` is
    inside it): a crash leaves a widget without a picture, which the admin's
    re-render action fixes, never a widget naming an unkept row.
    """
    from artifacts.preview import preview_render

    def keep(preview: Artifact) -> None:
        TaskArtifact.objects.get_or_create(
            task_id=task_id,
            artifact=preview,
            role=TaskArtifact.Role.PERSISTED,
            defaults={"step_id": step_id},
        )
        crashpoint(PREVIEW_BOUNDARY)

    try:
        return preview_render(artifact=Artifact.objects.get(pk=artifact_id), keep=keep)
    except Exception:  # noqa: BLE001 - a preview never fails what it shows
        log.exception("preview of artifact %s failed", artifact_id)
        return None


def conversation_create(*, owner, title: str) -> Conversation:
    """Create a conversation; a title the databases cannot store is refused
    (``TextError``) and bidi controls are dropped from it."""
    text_check(title, field="title")
    return Conversation.objects.create(
        owner=owner, title=title_clean(title)[:TITLE_MAX]
    )


def _next_seqs(task_id: int, count: int) -> int:
    """Reserve ``count`` sequence numbers for a task; return the last one
    (``tasks.statements.SEQS_RESERVE``, in the caller's transaction)."""
    with statements.cursor() as cursor:
        cursor.execute(statements.SEQS_RESERVE, [count, task_id])
        row = cursor.fetchone()
    if row is None:
        raise TaskNotFound(ERR_NO_TASK)
    return row[0]


def _append(
    task_id: int, entries: list[tuple[str, int | None, dict[str, Any] | None]]
) -> list[Event]:
    last = _next_seqs(task_id, len(entries))
    first = last - len(entries) + 1
    now = timezone.now()
    ids = events_insert(
        task_id=task_id,
        first_seq=first,
        entries=entries,
        created_at=now,
        returning=True,
    )
    events = []
    for pk, (i, (kind, step_id, data)) in zip(ids, enumerate(entries), strict=True):
        event = Event(
            id=pk,
            task_id=task_id,
            step_id=step_id,
            seq=first + i,
            kind=kind,
            data=data or {},
            created_at=now,
        )
        event._state.adding = False
        event._state.db = connection.alias
        events.append(event)
    return events


@transaction.atomic
def event_append(
    *,
    task_id: int,
    kind: str,
    step_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append one event to a task's log with the next gap-free sequence number."""
    return _append(task_id, [(kind, step_id, data)])[0]


@transaction.atomic
def events_append(
    *, task_id: int, entries: list[tuple[str, int | None, dict[str, Any] | None]]
) -> list[Event]:
    """Append several events (kind, step_id, data) in order, in one transaction."""
    if not entries:
        return []
    return _append(task_id, entries)


# -- a task's brain and the artifacts uploaded for it --------------------------

ERR_BAD_STEP = "step {id} is not a step of task {task}"


class UploadError(Invalid):
    pass


@transaction.atomic
def task_brain_record(*, task, brain: str, actor: str = "") -> bool:
    """Set the brain that drives ``task`` and log the change; return if it changed."""
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


def task_artifact_upload(
    *,
    task,
    stream,
    media_type: str,
    artifact_class: int,
    title: str = "",
    source_ids=(),
    step_id: int | None = None,
    max_bytes: int | None = None,
    expected_size: int | None = None,
    meta: dict[str, Any] | None = None,
    log: tuple[str, dict[str, Any]] | None = None,
):
    """Store an uploaded payload as an artifact that ``task`` persisted.

    All or nothing:

    1. Check the media type (``type/subtype``), the step and the sources
       (each one of the task owner's rows), before any I/O.
    2. Stream the body into the blob store (at most one chunk in memory),
       named only once the owner's quota admits it (``QuotaExceeded``, with
       the quota and the usage in its words, leaves nothing).
       Over ``max_bytes`` raises ``BlobTooLarge``; fewer or more bytes than
       ``expected_size`` (the declared Content-Length: a client gone
       mid-body) raise ``BlobIncomplete``; a read error raises as it is.
       Each leaves no blob and no temp file.
    3. In one transaction: the owner's row (``artifact_insert``: bytes the
       owner already stored keep that row as it is), its lineage, the task
       link and, with ``log`` (an event's kind and data), that event, which
       also names the artifact. A crash here leaves at worst an unreferenced
       blob, which the doctor sweeps ("write before show").
    4. After the commit, a widget gets its PNG preview exactly as a step's
       widget output does (``task_widget_preview``).
    """
    from artifacts.preview import WIDGET_MEDIA_TYPES

    _check_class(artifact_class)
    media_type_check(media_type, field="media type")
    owner_id = task.conversation.owner_id
    if step_id is not None and not Step.objects.filter(pk=step_id, task=task).exists():
        raise UploadError(ERR_BAD_STEP.format(id=step_id, task=task.pk))
    source_ids = sources_check(owner_id=owner_id, source_ids=source_ids)
    put = blob_put(
        stream=stream,
        max_bytes=max_bytes,
        expected_size=expected_size,
        owner_id=owner_id,
    )
    try:
        artifact = _upload_record(
            task=task,
            put=put,
            media_type=media_type,
            artifact_class=artifact_class,
            title=title,
            source_ids=source_ids,
            step_id=step_id,
            meta=meta,
            log=log,
        )
    except QuotaExceeded:
        blob_put_refused(sha256=put.sha256)
        raise
    if artifact.media_type in WIDGET_MEDIA_TYPES:
        task_widget_preview(artifact_id=artifact.pk, task_id=task.pk, step_id=step_id)
        artifact.refresh_from_db(fields=["meta"])
    return artifact


def _upload_record(
    *, task, put, media_type, artifact_class, title, source_ids, step_id, meta, log
) -> Artifact:
    """The uploaded blob's row, the task's link and ``log``'s event, in one
    transaction."""
    owner_id = task.conversation.owner_id
    with transaction.atomic():
        artifact = artifact_record(
            owner=owner_id,
            put=put,
            media_type=media_type,
            artifact_class=artifact_class,
            title=title,
            meta=meta or {"uploaded_for_task": task.pk},
            source_ids=source_ids,
        )
        TaskArtifact.objects.get_or_create(
            task=task,
            artifact=artifact,
            role=TaskArtifact.Role.PERSISTED,
            defaults={"step_id": step_id},
        )
        if log is not None:
            kind, data = log
            ref = {"artifact_id": artifact.pk, "sha": artifact.sha256}
            event_append(
                task_id=task.pk,
                kind=kind,
                step_id=step_id,
                data={**ref, "size": artifact.size, **data},
            )
    return artifact


# -- the brain's note -------------------------------------------------------------

NOTE_MEDIA_TYPE = "text/markdown"
NOTE_TITLE = "The brain's note"
ERR_NOTE_EMPTY = "a note needs some text"
ERR_NOTE_TOO_LONG = (
    f"a note is at most {NOTE_MAX_CHARS} characters, not {{length}}: keep what"
    " the next turn needs (refs, not payloads)"
)


def task_note_write(*, task, text: str, actor: str = ""):
    """Save the short note a brain carries from one turn to the next; return its artifact.

    What a brain must remember between turns lives in the task, not in its
    chat: the resume document shows the last note written, so a run cut and
    started again has it too. The note is a class-3 artifact (a snapshot):
    the brain's own words, which no call can make again, so resume reuses the
    saved note and never asks for it twice, and a note not saved was never
    shown. It is stored like any upload (``task_artifact_upload``): the blob
    first, then in one transaction its row, the task's link and
    ``note_written`` naming it. Writing the same words again reuses the row.
    """
    text_check(text, field="text")
    if not text.strip():
        raise UploadError(ERR_NOTE_EMPTY)
    if len(text) > NOTE_MAX_CHARS:
        raise UploadError(ERR_NOTE_TOO_LONG.format(length=len(text)))
    return task_artifact_upload(
        task=task,
        stream=iter([text.encode("utf-8")]),
        media_type=NOTE_MEDIA_TYPE,
        artifact_class=ArtifactClass.SNAPSHOT,
        title=NOTE_TITLE,
        meta={"note_for_task": task.pk},
        log=(Event.Kind.NOTE_WRITTEN, {"chars": len(text), "actor": actor[:200]}),
    )


# -- deletion -----------------------------------------------------------------

ERR_FOREIGN_KEYS_OFF = (
    "foreign keys are off on this connection: refusing to delete, because the "
    "schema's cascade would not fire and steps and events would be orphaned"
)
ERR_CASCADE_INCOMPLETE = (
    "the database did not cascade the conversation's delete to its tasks"
)
ERR_GC_MISMATCH = "artifact GC deleted a different number of rows than it planned"


@dataclass
class DeletionReport:
    """What ``conversation_delete`` removed (or, for a preview, would remove)
    and which artifacts it kept, each with the reason in plain words."""

    conversation_id: int
    conversations: int = 0
    rounds: int = 0
    turns: int = 0
    tasks: int = 0
    steps: int = 0
    events: int = 0
    links: int = 0
    removed_artifacts: list[ArtifactRecord] = field(default_factory=list)
    kept_artifacts: list[ArtifactRecord] = field(default_factory=list)

    def removed_counts(self) -> dict[str, int]:
        return {
            "conversations": self.conversations,
            "rounds": self.rounds,
            "turns": self.turns,
            "tasks": self.tasks,
            "steps": self.steps,
            "events": self.events,
            "links": self.links,
            "artifacts": len(self.removed_artifacts),
        }

    @property
    def total_removed(self) -> int:
        return sum(self.removed_counts().values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "removed": self.removed_counts(),
            "removed_artifacts": [r.as_dict() for r in self.removed_artifacts],
            "kept_artifacts": [r.as_dict() for r in self.kept_artifacts],
        }


@dataclass(frozen=True)
class ConversationPart:
    """Rows of ``model`` (found by the ``conversation`` lookup) go with a
    conversation; their count adds to the delete report's ``label``."""

    label: str
    model: Any
    conversation: str


# Apps above tasks add the rows they keep under a conversation (council:
# rounds, turns, turn links) from their AppConfig.ready().
_parts: dict[tuple[str, str], ConversationPart] = {}


def conversation_part_register(part: ConversationPart) -> None:
    _parts[(part.label, part.model._meta.label)] = part


def _deletion_plan(conversation_id: int, *, lock: bool) -> DeletionReport:
    """Count the subtree with aggregate queries and run the artifact rule.

    Shared by the delete and its preview, so both give the same numbers. The
    candidates are what the conversation's rows keep (``artifacts.keepers``).
    """
    mine = {"conversation_id": conversation_id}
    theirs = {"task__conversation_id": conversation_id}
    report = DeletionReport(
        conversation_id=conversation_id,
        conversations=1,
        tasks=Task.objects.filter(**mine).count(),
        steps=Step.objects.filter(**theirs).count(),
        events=Event.objects.filter(**theirs).count(),
        links=TaskArtifact.objects.filter(**theirs).count(),
    )
    for part in _parts.values():
        counted = part.model.objects.filter(
            **{f"{part.conversation}_id": conversation_id}
        ).count()
        setattr(report, part.label, getattr(report, part.label) + counted)
    plan = gc_plan(
        candidate_ids=conversation_artifact_ids(conversation_id=conversation_id),
        leaving_conversation_id=conversation_id,
        lock=lock,
    )
    report.removed_artifacts = plan.remove
    report.kept_artifacts = plan.keep
    return report


def _foreign_keys_enforced() -> bool:
    """Return whether this connection would run the schema's cascades."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA foreign_keys")
            return bool(cursor.fetchone()[0])
        if connection.vendor == "postgresql":
            # "replica" switches off the triggers that carry FK actions.
            cursor.execute("SELECT current_setting('session_replication_role')")
            return cursor.fetchone()[0] != "replica"
    return True


def conversation_deletion_preview(*, conversation: Conversation) -> DeletionReport:
    """Return what ``conversation_delete`` would remove and keep; write nothing.

    Counts come from aggregate queries (no event row is loaded), and the
    artifact rule is the same code the delete runs.
    """
    return _deletion_plan(conversation.pk, lock=False)


def conversation_delete(*, conversation_id: int) -> DeletionReport:
    """Delete a conversation with its whole stateful subtree.

    0. Before the lock: if a tool call of the subtree was cut off after its
       payload may have been written and before ``payload_persisted`` named
       it, find the blobs the store holds from that call's time that nothing
       names (``_cut_call_blobs``: the store's listing, read without holding
       any lock).
    1. Take the lock: SQLite's write lock is held from BEGIN (IMMEDIATE);
       PostgreSQL locks the conversation row. Refuse if foreign keys are off.
    2. Count the subtree and plan the artifact rule to its fixed point
       (locking the candidate artifact rows on PostgreSQL).
    3. Delete the conversation row; the schema cascades to council rounds,
       participants, turns and turn links, tasks, steps, events and ownership
       links. No row is loaded into Python.
    4. Delete the artifacts nothing alive keeps; their lineage edges cascade.
       Their shas, those of payloads the subtree's events name but no row
       does, and those its cut-off calls wrote (0), are written to the
       pending-unlink record in this transaction, less any another task's
       event names.
    5. After commit, unlink those files that no row names (a rollback leaves
       every file; a crash leaves the record for the next delete, worker
       start or doctor run, which finish it at once), and remove the
       class-1 folders of its tasks (a crash leaves them to the doctor:
       ``gone_task_files``).

    A conversation that is already gone gives an empty report.
    """
    cut = _cut_call_blobs(conversation_id)
    return _conversation_delete(conversation_id, cut)


@transaction.atomic
def _conversation_delete(conversation_id: int, cut: set[str]) -> DeletionReport:
    """``conversation_delete`` from step 1, in one locked transaction."""
    if not _foreign_keys_enforced():
        raise RuntimeError(ERR_FOREIGN_KEYS_OFF)
    exists = (
        Conversation.objects.select_for_update()
        .filter(pk=conversation_id)
        .values_list("pk", flat=True)
    )
    if not list(exists):
        return DeletionReport(conversation_id=conversation_id)
    report = _deletion_plan(conversation_id, lock=True)

    unnamed = _payload_shas_without_rows(conversation_id, report) | cut

    task_ids = list(
        Task.objects.filter(conversation_id=conversation_id).values_list(
            "pk", flat=True
        )
    )
    # One statement, and the schema's ON DELETE CASCADE does the rest: the
    # model's own delete() refuses (it names this service), and no collector
    # loads a row.
    table = connection.ops.quote_name(Conversation._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [conversation_id])
    if Task.objects.filter(conversation_id=conversation_id).exists():
        raise RuntimeError(ERR_CASCADE_INCOMPLETE)

    # Runs first after the commit: tests kill the process here to leave the
    # pending unlinks for the next delete, worker start or doctor run.
    transaction.on_commit(lambda: crashpoint("after_delete_commit"))
    deleted = artifacts_delete(records=report.removed_artifacts)
    if deleted != len(report.removed_artifacts):
        raise RuntimeError(ERR_GC_MISMATCH)
    # Payloads no row names (a call cut off between its blob and its result)
    # go too, unless a surviving task's envelope still names them.
    blobs_unlink_after_commit(shas=_not_named_by_survivors(unnamed))
    # The class-1 files its calls wrote (their blob copies went above).
    transaction.on_commit(lambda: task_folders_remove(task_ids))
    return report


def _payload_shas_without_rows(
    conversation_id: int, report: DeletionReport
) -> set[str]:
    """Shas the subtree's ``payload_persisted`` events name and no artifact row does."""
    named = Event.objects.filter(
        task__conversation_id=conversation_id, kind=Event.Kind.PAYLOAD_PERSISTED
    ).values_list("data__sha", flat=True)
    shas = {sha for sha in named if isinstance(sha, str) and len(sha) == 64}
    shas -= {r.sha256 for r in report.removed_artifacts}
    for chunk in batched(sorted(shas)):
        shas -= set(
            Artifact.objects.filter(sha256__in=chunk).values_list("sha256", flat=True)
        )
    return shas


def _not_named_by_survivors(shas: set[str]) -> list[str]:
    """Drop shas that a payload_persisted event of another task still names."""
    keep: set[str] = set()
    for chunk in batched(sorted(shas)):
        keep.update(
            Event.objects.filter(
                kind=Event.Kind.PAYLOAD_PERSISTED, data__sha__in=chunk
            ).values_list("data__sha", flat=True)
        )
    return sorted(shas - keep)


# Seconds either side of a cut-off call's span: the event's clock and the
# store's (a bucket's LastModified counts whole seconds) may differ a little.
CUT_CALL_SLACK = 2.0
# A call's blob is written before any of these follows its tool_call_started
# in the step: named (payload_persisted), noted as unsaved by the executor
# (which records what it wrote as a pending unlink itself), or never written
# (the tool failed).
_CALL_ACCOUNTED = (
    Event.Kind.PAYLOAD_PERSISTED,
    Event.Kind.OUTPUT_UNSAVED,
    Event.Kind.TOOL_CALL_FAILED,
)


def _cut_calls(conversation_id: int):
    """(started at, ended by, lease expiry) of each tool call of the subtree
    cut off (a crash, a killed worker) before its payload was accounted for:
    no accounting event follows its ``tool_call_started`` in its step before
    the step's next call. "Ended by" is the task's next event (its pause,
    release or take-over; lease renewals aside). One query."""
    started = Event.Kind.TOOL_CALL_STARTED
    next_call = (
        Event.objects.filter(
            step_id=OuterRef("step_id"), kind=started, seq__gt=OuterRef("seq")
        )
        .order_by("seq")
        .values("seq")[:1]
    )
    accounted = Event.objects.filter(
        step_id=OuterRef("step_id"),
        kind__in=_CALL_ACCOUNTED,
        seq__gt=OuterRef("seq"),
        seq__lt=Coalesce(OuterRef("next_call"), Value(2**31 - 1)),
    )
    ended = (
        Event.objects.filter(task_id=OuterRef("task_id"), seq__gt=OuterRef("seq"))
        .exclude(kind=Event.Kind.LEASE_RENEWED)
        .order_by("seq")
        .values("created_at")[:1]
    )
    return (
        Event.objects.filter(task__conversation_id=conversation_id, kind=started)
        .annotate(next_call=Subquery(next_call))
        .filter(~Exists(accounted))
        .annotate(ended=Subquery(ended))
        .values_list("created_at", "ended", "task__lease_expires_at")
    )


def _cut_call_blobs(conversation_id: int) -> set[str]:
    """Blobs the subtree's cut-off calls wrote that nothing names.

    Nothing recorded their shas (the call was cut off between the blob and
    the event that names it), so they are found by time: a blob written
    between a cut call's ``tool_call_started`` and the task's next event
    (its pause, release or take-over; if none came yet, its lease's expiry,
    or now while the lease lives). Left out: any blob a row or a pending
    unlink names (one an event of another task names is left out later, in
    the delete's transaction), and any blob written since a call of another
    conversation's task under a live lease began (its own payload, maybe
    not yet named). What is left out the doctor sweeps after its grace
    period, as before. Lists the store only when the subtree has a cut call,
    and holds no lock meanwhile; a fixed number of queries.
    """
    now = time.time()
    spans = []
    for started, ended, expiry in _cut_calls(conversation_id):
        end = ended or expiry  # no take-over yet: the call ended by its lease
        end = min(end.timestamp(), now) if end else now
        spans.append((started.timestamp() - CUT_CALL_SLACK, end + CUT_CALL_SLACK))
    if not spans:
        return set()
    busy = (
        Task.objects.exclude(conversation_id=conversation_id)
        .exclude(pk__in=Task.objects.lease_dead().values("pk"))
        .values("pk")
    )
    calls_elsewhere = (
        Event.objects.filter(task_id__in=busy, kind=Event.Kind.TOOL_CALL_STARTED)
        .values("task_id")
        .annotate(last=Max("created_at"))
        .values_list("last", flat=True)
    )
    busy_since = min(
        (at.timestamp() - CUT_CALL_SLACK for at in calls_elsewhere), default=now
    )
    found = {
        blob.sha256
        for blob in default_store().iter_blobs()
        if blob.modified < busy_since
        and any(start <= blob.modified <= end for start, end in spans)
    }
    for chunk in batched(sorted(found)):
        found -= set(
            Artifact.objects.filter(sha256__in=chunk).values_list("sha256", flat=True)
        )
        found -= set(
            PendingUnlink.objects.filter(sha256__in=chunk).values_list(
                "sha256", flat=True
            )
        )
    return found
