"""The step executor: one step of one task, by one worker, durable at every boundary.

``step(task_id=…, worker_id=…)``:

1. Take the task's lease in one conditional UPDATE (ours, free, or expired;
   a takeover logs ``lease_taken_over`` naming the previous owner).
2. Rehydrate now, and only here: pick the first step that is not done.
3. A step still ``running`` has an open envelope (``tool_call_started`` with no
   closing event): the uncertain state. Resolve it by its class
   (``tasks.resume.uncertain_decide``), never by blindly re-running.
4. Otherwise count the attempt and commit ``tool_call_started`` before the call.
5. Call the tool with a context carrying the idempotency key
   ``pippa:<task>:<step>:<generation>`` (only an explicit retry bumps the
   generation, so a resumed uncertain call keeps its key).
6. Write the payload blob (temp, fsync, rename, fsync dir) and commit
   ``payload_persisted`` with its sha.
7. In one transaction: the artifact row, the ownership link, the step's output
   ref and ``done``, ``tool_result_persisted``. Only then return the result.
8. The lease was renewed by every write; it is released when the task stops
   being runnable (done, failed, needs review).

Every write after the lease is taken is conditional on still holding it, so a
worker that lost its lease cannot record a result. The hot path uses a few
hand-written statements (one ``UPDATE … RETURNING`` per transaction reserves
the event sequence numbers and renews the lease at once); see
``bench/bench_executor.py``.

Crash tests set ``PIPPA_CRASHPOINT=<boundary>[:<n>]`` (or ``random:<p>:<seed>``)
to make the process SIGKILL itself at a boundary; see ``crashpoint``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field, replace
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from artifacts.gc import blobs_unlink_after_commit
from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from artifacts.preview import WIDGET_MEDIA_TYPES, preview_render
from artifacts.services import ERR_BLOB_VANISHED, BlobVanished, blob_guard
from artifacts.store import default_store
from tasks.faults import (  # noqa: F401 - crash points are re-exported for tests
    BOUNDARIES,
    SimulatedCrash,
    crashpoint,
    crashpoint_configure,
    fault_reason,
    retry_delay,
)
from tasks.models import TASK_OPEN, Event, LinkRole, Step, Task, TaskArtifact
from tasks.resume import (
    ADOPT,
    CALL_AGAIN,
    REVIEW,
    Envelope,
    class1_file,
    envelope_read,
    payload_intact,
    source_ids_for,
    sources_alive,
    uncertain_decide,
)
from tasks.services import events_append, events_insert
from tasks.tools import ToolContext, ToolResult, files_root, tool_get

log = logging.getLogger("pippa.executor")

ERR_NOT_RETRYABLE = (
    "only a failed or needs-review step can be retried (step {position} is {status})"
)
ERR_LEASE_HELD = "a worker ({owner}) holds this task's lease until {until}; wait, or force the release"
ERR_TASK_DONE = "the task is done; branch it to continue from an earlier step"
ERR_RESUME_BLOCKED = "step {position} is {status}: retry or resolve it before resuming"
ERR_BRANCH_POSITION = "branch after a step from 0 to {total}"
ERR_BRANCH_UNFINISHED = (
    "step {position} is {status}: a branch keeps only finished steps"
)
ERR_ACTION_UNKNOWN = "unknown action {action!r}: use adopt, rerun, fail or skip"
ERR_ACTION_NOT_ALLOWED = (
    "{action!r} is not allowed for step {position} now; allowed: {allowed}"
)
ERR_NO_OUTPUT = "the tool returned no payload"
ERR_FILE_OUTSIDE = "a class-1 tool must write its file under the files folder"
ERR_TASK_NOT_RUNNABLE = (
    "the task is {status}; only a queued or running task can be paused"
)
ERR_UNSAVED = "the tool ran; its output could not be saved: {reason}"
ERR_WAITING = "waiting before attempt {attempt}: next attempt {when}"
ERR_TASK_CANCELLED = (
    "the task was cancelled; branch it to continue from an earlier step"
)
ERR_NOT_CANCELLABLE = "the task is {status}; only an unfinished task can be cancelled"
ERR_BRANCH_NOTHING = (
    "a branch after the last step would be a copy that changes nothing:"
    " branch from an earlier step"
)

ACTIONS = ("adopt", "rerun", "fail", "skip")
FINISHED = (Step.Status.DONE, Step.Status.SKIPPED)
MAX_PAYLOAD_META_CHARS = 1500


class ExecutorError(ValueError):
    pass


class LeaseLost(RuntimeError):
    """Another worker took the lease: this worker must not record anything."""


# -- outcome ------------------------------------------------------------------


@dataclass(frozen=True)
class StepOutcome:
    task_id: int
    task_status: str
    step_id: int | None = None
    position: int | None = None
    status: str = ""  # the step's status after this call
    invoked: bool = False  # the tool was really called
    rule: str = ""  # how an uncertain state was resolved, if it was
    artifact: dict[str, Any] | None = None
    error: str = ""
    # The store or the database failed after the tool returned (or before the
    # step could be recorded): the worker waits for it to be writable again.
    fault: str = ""
    fault_bytes: int = 0  # size of the write that failed, for the probe
    next_attempt_at: Any = None  # a failed tool's back-off: not before this


@dataclass
class _StepRow:
    id: int
    task_id: int
    position: int
    title: str
    status: str
    tool: str
    args: dict[str, Any]
    artifact_class: int
    side_effects: bool
    attempts: int
    max_attempts: int
    generation: int
    next_attempt_at: Any = None

    @property
    def key(self) -> str:
        return f"pippa:{self.task_id}:{self.id}:{self.generation}"

    def as_step(self) -> Step:
        return Step(
            id=self.id,
            task_id=self.task_id,
            position=self.position,
            title=self.title,
            status=self.status,
            tool=self.tool,
            args=self.args,
            artifact_class=self.artifact_class,
            side_effects=self.side_effects,
            attempts=self.attempts,
            max_attempts=self.max_attempts,
            generation=self.generation,
        )


@dataclass
class _Lease:
    steps_total: int
    steps_done: int
    entries: list[tuple[str, int | None, dict[str, Any]]] = field(default_factory=list)


# -- SQL of the hot path ------------------------------------------------------

T_TASK = Task._meta.db_table
T_STEP = Step._meta.db_table
T_EVENT = Event._meta.db_table
T_LINK = TaskArtifact._meta.db_table
T_ART = Artifact._meta.db_table
T_SRC = ArtifactSource._meta.db_table


def _json_ph() -> str:
    return "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"


def _dt(value):
    return connection.ops.adapt_datetimefield_value(value)


def _loads(value: Any) -> Any:
    if isinstance(value, (str, bytes, bytearray)):
        return json.loads(value)
    return value


def _lease_until():
    return timezone.now() + timedelta(seconds=settings.PIPPA_LEASE_SECONDS)


def _append_held(
    cursor,
    task_id: int,
    worker_id: str,
    entries: list[tuple[str, int | None, dict]],
    *,
    extra_set: str = "",
    extra_params: tuple = (),
) -> tuple:
    """Reserve seqs, renew the lease and append events, if the lease is still ours.

    One ``UPDATE … RETURNING`` does the seq range, the renewal and the lease
    check; ``extra_set`` adds columns to the same statement.
    """
    cursor.execute(
        f"UPDATE {T_TASK} SET last_seq = last_seq + %s, lease_expires_at = %s, "
        f"updated_at = %s{extra_set} WHERE id = %s AND lease_owner = %s "
        f"RETURNING last_seq, steps_done, steps_total",
        [
            len(entries),
            _dt(_lease_until()),
            _dt(timezone.now()),
            *extra_params,
            task_id,
            worker_id,
        ],
    )
    row = cursor.fetchone()
    if row is None:
        raise LeaseLost(f"task {task_id}: lease no longer held by {worker_id}")
    if entries:
        events_insert(
            task_id=task_id,
            first_seq=row[0] - len(entries) + 1,
            entries=entries,
            created_at=timezone.now(),
        )
    return row


def _lease_take(cursor, task_id: int, worker_id: str) -> _Lease | None:
    """Take or renew the task's lease with conditional UPDATEs; None if another holds it."""
    now = timezone.now()
    until = _dt(now + timedelta(seconds=settings.PIPPA_LEASE_SECONDS))
    # Renewal: the common case, one statement.
    cursor.execute(
        f"UPDATE {T_TASK} SET lease_expires_at = %s, status = 'running', updated_at = %s "
        f"WHERE id = %s AND lease_owner = %s AND status IN ('queued', 'running') "
        f"RETURNING steps_total, steps_done",
        [until, _dt(now), task_id, worker_id],
    )
    row = cursor.fetchone()
    if row is not None:
        return _Lease(row[0], row[1])
    cursor.execute(
        f"SELECT status, lease_owner, lease_expires_at FROM {T_TASK} WHERE id = %s",
        [task_id],
    )
    row = cursor.fetchone()
    if row is None or row[0] not in (Task.Status.QUEUED, Task.Status.RUNNING):
        return None
    _, previous, expires = row
    if previous:
        expires_at = _parse_dt(expires)
        if expires_at is not None and expires_at >= now:
            return None
        cursor.execute(
            f"UPDATE {T_TASK} SET lease_owner = %s, lease_expires_at = %s, "
            f"status = 'running', updated_at = %s WHERE id = %s AND lease_owner = %s "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
            f"AND status IN ('queued', 'running') RETURNING steps_total, steps_done",
            [worker_id, until, _dt(now), task_id, previous, _dt(now)],
        )
        entry = (
            Event.Kind.LEASE_TAKEN_OVER,
            None,
            {
                "worker": worker_id,
                "previous_owner": previous,
                "expired_at": expires_at.isoformat() if expires_at else None,
            },
        )
    else:
        cursor.execute(
            f"UPDATE {T_TASK} SET lease_owner = %s, lease_expires_at = %s, "
            f"status = 'running', updated_at = %s WHERE id = %s AND lease_owner = '' "
            f"AND status IN ('queued', 'running') RETURNING steps_total, steps_done",
            [worker_id, until, _dt(now), task_id],
        )
        entry = (Event.Kind.LEASE_TAKEN, None, {"worker": worker_id})
    row = cursor.fetchone()
    if row is None:
        return None
    return _Lease(row[0], row[1], [entry])


def _parse_dt(value):
    """A lease expiry as read by a raw cursor (a string on SQLite) -> aware datetime."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def _next_step(cursor, task_id: int) -> _StepRow | None:
    cursor.execute(
        f"SELECT id, position, title, status, tool, args, artifact_class, side_effects, "
        f"attempts, max_attempts, generation, next_attempt_at FROM {T_STEP} "
        f"WHERE task_id = %s "
        f"AND status NOT IN ('done', 'skipped') ORDER BY position LIMIT 1",
        [task_id],
    )
    row = cursor.fetchone()
    if row is None:
        return None
    return _StepRow(
        id=row[0],
        task_id=task_id,
        position=row[1],
        title=row[2],
        status=row[3],
        tool=row[4],
        args=_loads(row[5]) or {},
        artifact_class=row[6],
        side_effects=bool(row[7]),
        attempts=row[8],
        max_attempts=row[9],
        generation=row[10],
        next_attempt_at=_parse_dt(row[11]),
    )


# -- lease keeper: renews held leases while a long tool call runs -------------


class _LeaseKeeper:
    """One daemon thread per process renewing the leases of calls in flight."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.held: dict[tuple[int, str], bool] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread = threading.Thread(
            target=self._run, daemon=True, name="pippa-lease"
        )
        self.thread.start()

    def _run(self) -> None:
        from django.db import connection as conn

        while True:
            interval = max(0.2, settings.PIPPA_LEASE_SECONDS / 3)
            self.wake.wait(interval)
            self.wake.clear()
            with self.lock:
                held = [k for k, lost in self.held.items() if not lost]
            if not held:
                # Hold no idle connection (PostgreSQL would keep a backend busy).
                conn.close()
                continue
            for task_id, worker_id in held:
                try:
                    with transaction.atomic(), conn.cursor() as cursor:
                        _append_held(
                            cursor,
                            task_id,
                            worker_id,
                            [(Event.Kind.LEASE_RENEWED, None, {"worker": worker_id})],
                        )
                except LeaseLost:
                    with self.lock:
                        if (task_id, worker_id) in self.held:
                            self.held[(task_id, worker_id)] = True
                except DatabaseError as exc:
                    # One line, no traceback: the worker logs the fault itself.
                    log.warning(
                        "lease renewal failed for task %s: %s",
                        task_id,
                        fault_reason(exc),
                    )
                    conn.close()
                except Exception:  # noqa: BLE001 - a failed renewal is retried next round
                    log.exception("lease renewal failed for task %s", task_id)
            # A renewal every few seconds does not need a standing connection,
            # and one left open would keep a PostgreSQL backend (and its
            # database) busy after the worker is done.
            conn.close()

    def hold(self, task_id: int, worker_id: str) -> None:
        with self.lock:
            self.held[(task_id, worker_id)] = False

    def drop(self, task_id: int, worker_id: str) -> bool:
        """Stop renewing; return True if the lease was lost meanwhile."""
        with self.lock:
            return self.held.pop((task_id, worker_id), False)


_keeper: _LeaseKeeper | None = None


def _lease_keeper() -> _LeaseKeeper:
    global _keeper
    if _keeper is None or _keeper.pid != os.getpid():
        _keeper = _LeaseKeeper()
    return _keeper


# -- the step -----------------------------------------------------------------


def step(*, task_id: int, worker_id: str) -> StepOutcome | None:
    """Run one step of one task; None when the lease is held elsewhere or the task is idle.

    See the module docstring for the numbered state machine.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        lease = _lease_take(cursor, task_id, worker_id)
        if lease is None:
            _release_if_stopped(cursor, task_id, worker_id)
            return None
        row = _next_step(cursor, task_id)
        if row is None:
            status = _close_task(
                cursor, task_id, worker_id, Task.Status.DONE, lease.entries
            )
            return StepOutcome(task_id=task_id, task_status=status)
        if row.status in (Step.Status.NEEDS_REVIEW, Step.Status.FAILED):
            task_status = (
                Task.Status.FAILED
                if row.status == Step.Status.FAILED
                else Task.Status.NEEDS_REVIEW
            )
            status = _close_task(cursor, task_id, worker_id, task_status, lease.entries)
            return StepOutcome(
                task_id=task_id,
                task_status=status,
                step_id=row.id,
                position=row.position,
                status=row.status,
            )
        if row.status == Step.Status.RUNNING:
            if lease.entries:
                _append_held(cursor, task_id, worker_id, lease.entries)
            uncertain = True
        elif row.next_attempt_at and row.next_attempt_at > timezone.now():
            return _waiting(cursor, row, worker_id, lease)
        else:
            uncertain = False
            if row.attempts >= row.max_attempts:
                return _fail_exhausted(cursor, row, worker_id, lease.entries)
            _start(cursor, row, worker_id, lease.entries)
            crashpoint("before_started_commit")
    if uncertain:
        return _resolve_uncertain(row, worker_id)
    return _call(row, worker_id)


def _waiting(cursor, row: _StepRow, worker_id: str, lease: _Lease) -> StepOutcome:
    """The step is waiting out its back-off: take nothing, say until when."""
    if lease.entries:
        # The lease was only just taken for this look: leave no trace of it.
        transaction.set_rollback(True)
        task_status = Task.Status.QUEUED
    else:
        task_status = _close_task(
            cursor, row.task_id, worker_id, Task.Status.QUEUED, [], reason="waiting"
        )
    return StepOutcome(
        task_id=row.task_id,
        task_status=task_status,
        step_id=row.id,
        position=row.position,
        status=Step.Status.PENDING,
        error=ERR_WAITING.format(
            attempt=row.attempts + 1, when=_from_now(row.next_attempt_at)
        ),
        next_attempt_at=row.next_attempt_at,
    )


def _from_now(when) -> str:
    seconds = max(0, round((when - timezone.now()).total_seconds()))
    return f"in {seconds} s"


def _release_if_stopped(cursor, task_id: int, worker_id: str) -> None:
    """The step boundary of a pause or cancel: give the lease back.

    A person paused or cancelled the task while this worker held it; the call
    in flight has finished and is saved, and no further step starts.
    """
    cursor.execute(
        f"UPDATE {T_TASK} SET lease_owner = '', lease_expires_at = NULL "
        f"WHERE id = %s AND lease_owner = %s AND status IN ('paused', 'cancelled') "
        f"RETURNING status",
        [task_id, worker_id],
    )
    row = cursor.fetchone()
    if row is not None:
        events_append(
            task_id=task_id,
            entries=[
                (
                    Event.Kind.LEASE_RELEASED,
                    None,
                    {"worker": worker_id, "reason": row[0]},
                )
            ],
        )


def _start(cursor, row: _StepRow, worker_id: str, pre: list) -> None:
    """Count the attempt and log ``tool_call_started`` (caller commits it)."""
    cursor.execute(
        f"UPDATE {T_STEP} SET status = 'running', attempts = attempts + 1, "
        f"started_at = %s, finished_at = NULL, next_attempt_at = NULL WHERE id = %s",
        [_dt(timezone.now()), row.id],
    )
    row.attempts += 1
    row.status = Step.Status.RUNNING
    _append_held(
        cursor,
        row.task_id,
        worker_id,
        [
            *pre,
            (
                Event.Kind.TOOL_CALL_STARTED,
                row.id,
                {
                    "tool": row.tool,
                    "class": row.artifact_class,
                    "attempt": row.attempts,
                    "generation": row.generation,
                    "key": row.key,
                    "worker": worker_id,
                },
            ),
        ],
    )


def _close_task(
    cursor, task_id: int, worker_id: str, status: str, pre: list, *, reason: str = ""
) -> str:
    """Set a task's final, blocked or queued status and release the lease, with events."""
    entries = list(pre)
    if status == Task.Status.DONE:
        entries.append((Event.Kind.TASK_FINISHED, None, {"status": status}))
    entries.append(
        (
            Event.Kind.LEASE_RELEASED,
            None,
            {"worker": worker_id, "reason": reason or status},
        )
    )
    now = timezone.now()
    finished = _dt(now) if status in (Task.Status.DONE, Task.Status.FAILED) else None
    # A person's cancel (or pause, against a mere re-queue) made while the
    # lease was held stands: the worker's bookkeeping does not undo it.
    kept = (
        "('cancelled', 'paused')" if status == Task.Status.QUEUED else "('cancelled')"
    )
    _append_held(
        cursor,
        task_id,
        worker_id,
        entries,
        extra_set=(
            f", status = CASE WHEN status IN {kept} THEN status ELSE %s END"
            ", finished_at = CASE WHEN status = 'cancelled' THEN finished_at"
            " ELSE %s END"
        ),
        extra_params=(status, finished),
    )
    cursor.execute(
        f"UPDATE {T_TASK} SET lease_owner = '', lease_expires_at = NULL WHERE id = %s",
        [task_id],
    )
    return status


def _fail_exhausted(cursor, row: _StepRow, worker_id: str, pre: list) -> StepOutcome:
    cursor.execute(
        f"UPDATE {T_STEP} SET status = 'failed', finished_at = %s WHERE id = %s",
        [_dt(timezone.now()), row.id],
    )
    entries = [
        *pre,
        (
            Event.Kind.STEP_FAILED,
            row.id,
            {"attempts": row.attempts, "reason": "no attempts left"},
        ),
    ]
    status = _close_task(cursor, row.task_id, worker_id, Task.Status.FAILED, entries)
    return StepOutcome(
        task_id=row.task_id,
        task_status=status,
        step_id=row.id,
        position=row.position,
        status=Step.Status.FAILED,
        error="no attempts left",
    )


def _call(row: _StepRow, worker_id: str, *, rule: str = "") -> StepOutcome:
    """Call the tool of a step whose ``tool_call_started`` is committed; persist.

    A failure of the tool (it raised, or returned no usable output) is the
    tool's: the attempt fails and is retried after a back-off. A failure once
    the tool has returned (the blob write, the payload or result transaction)
    is the executor's: ``_output_unsaved`` decides it like an open envelope.
    """
    crashpoint("after_started")
    root = files_root()
    ctx = ToolContext(
        task_id=row.task_id,
        step_id=row.id,
        position=row.position,
        generation=row.generation,
        attempt=row.attempts,
        idempotency_key=row.key,
        files_root=root,
    )
    # Inside an outer transaction (tests) no other connection could renew.
    keeper = _lease_keeper() if not connection.in_atomic_block else None
    if keeper:
        keeper.hold(row.task_id, worker_id)
    failure: Exception | None = None
    unsaved: Exception | None = None
    needed = 0
    try:
        try:
            tool = tool_get(row.tool)
            output = _tool_output(row, tool.fn(ctx, **row.args), root)
        except Exception as exc:  # noqa: BLE001 - any tool error fails the attempt
            failure = exc
        else:
            needed = output.size
            try:
                payload = _persist_blob(row, tool.media_type, output)
            except Exception as exc:  # noqa: BLE001 - the store's failure, not the tool's
                unsaved = exc
    finally:
        lost = keeper.drop(row.task_id, worker_id) if keeper else False
    if lost:
        raise LeaseLost(f"task {row.task_id}: lease lost during the call")
    if failure is not None:
        return _record_failure(
            row, worker_id, f"{type(failure).__name__}: {failure}", rule
        )
    if unsaved is not None:
        return _output_unsaved(
            row, worker_id, unsaved, stage="blob", needed=needed, rule=rule
        )
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            _append_held(
                cursor,
                row.task_id,
                worker_id,
                [(Event.Kind.PAYLOAD_PERSISTED, row.id, payload)],
            )
    except DatabaseError as exc:
        return _output_unsaved(
            row, worker_id, exc, stage="payload", rule=rule, written=payload["sha"]
        )
    crashpoint("after_payload")
    try:
        outcome = _finish(row, worker_id, payload, invoked=True, rule=rule)
    except (DatabaseError, OSError, BlobVanished) as exc:
        return _output_unsaved(row, worker_id, exc, stage="result", rule=rule)
    crashpoint("after_result")
    return outcome


@dataclass
class _Output:
    """What the tool handed back, checked: bytes, or a class-1 file under the root."""

    result: ToolResult
    data: bytes | None = None
    path: Path | None = None
    rel_path: str | None = None
    size: int = 0


def _tool_output(row: _StepRow, result: Any, root: Path) -> _Output:
    """Check what the tool returned; a bad answer is the tool's failure."""
    if isinstance(result, (bytes, bytearray, str)):
        result = ToolResult(
            data=result.encode() if isinstance(result, str) else bytes(result)
        )
    if not isinstance(result, ToolResult):
        raise TypeError("a tool must return a ToolResult, bytes or str")
    if row.artifact_class == ArtifactClass.FILE and result.path is not None:
        path = Path(result.path)
        if not path.is_absolute():
            path = root / f"t{row.task_id}" / f"s{row.id}-g{row.generation}" / path
        path = path.resolve()
        if not path.is_relative_to(root.resolve()):
            raise ValueError(ERR_FILE_OUTSIDE)
        return _Output(
            result,
            path=path,
            rel_path=str(path.relative_to(root.resolve())),
            size=path.stat().st_size,  # a missing file is the tool's failure
        )
    if result.data is None:
        raise ValueError(ERR_NO_OUTPUT)
    return _Output(result, data=result.data, size=len(result.data))


def _persist_blob(row: _StepRow, default_media: str, output: _Output) -> dict[str, Any]:
    """Write the payload blob (durably) and return the ``payload_persisted`` data."""
    crashpoint("after_tool")
    result = output.result
    if output.path is not None:
        with output.path.open("rb") as fh:
            put = default_store().put_file(fh)
    else:
        put = default_store().put_bytes(output.data)
    meta = dict(result.meta or {})
    if len(json.dumps(meta, default=str)) > MAX_PAYLOAD_META_CHARS:
        meta = {"meta_dropped": "too large for the event log"}
    payload: dict[str, Any] = {
        "sha": put.sha256,
        "size": put.size,
        "media_type": (result.media_type or default_media)[:255],
        "title": (result.title or row.title)[:200],
        "meta": meta,
        "attempt": row.attempts,
        "generation": row.generation,
        "key": row.key,
    }
    if output.rel_path:
        payload["path"] = output.rel_path
    if result.source_ids:
        payload["source_ids"] = [int(x) for x in result.source_ids][:50]
    return payload


def _output_unsaved(
    row: _StepRow,
    worker_id: str,
    exc: BaseException,
    *,
    stage: str,
    needed: int = 0,
    rule: str = "",
    written: str = "",
) -> StepOutcome:
    """The tool returned but its output could not be saved: the executor's failure.

    Never a tool failure (that would call a tool with outside effects again
    with no person deciding). Log ``output_unsaved`` with the reason, leaving
    the envelope open, and take the open envelope's decision by class at once
    only when it is "needs review" (a tool with outside effects, say). Adopt
    and call-again wait until the store takes writes again: the worker backs
    off, probes and then resumes the step by its class. If the database
    itself refuses the note, nothing is written and the envelope stays open
    for the same decision later.

    A blob written whose ``payload_persisted`` never committed (``written``)
    is named by nothing, and resume never adopts it: it goes to the
    pending-unlink record with the note (or with a later one, if the database
    refuses this one).
    """
    reason = fault_reason(exc)
    if written:
        _unnamed_blobs.add(written)
    words = ERR_UNSAVED.format(reason=reason)
    log.warning(
        "task %s step %s: %s (%s: %s)",
        row.task_id,
        row.position,
        words,
        type(exc).__name__,
        str(exc)[:200],
    )
    outcome = StepOutcome(
        task_id=row.task_id,
        task_status=Task.Status.RUNNING,
        step_id=row.id,
        position=row.position,
        status=Step.Status.RUNNING,
        invoked=True,
        rule=rule,
        error=words,
        fault=reason,
        fault_bytes=needed,
    )
    if isinstance(exc, DatabaseError) and not connection.in_atomic_block:
        connection.close()  # a fresh connection for the note (PostgreSQL restarted)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            unnamed_blobs_record()
            _append_held(
                cursor,
                row.task_id,
                worker_id,
                [
                    (
                        Event.Kind.OUTPUT_UNSAVED,
                        row.id,
                        {
                            "reason": reason,
                            "stage": stage,
                            "error": f"{type(exc).__name__}: {exc}"[:300],
                            "worker": worker_id,
                        },
                    )
                ],
            )
        env = envelope_read(row.id)
        advice = uncertain_decide(row.as_step(), env)
        if advice.action == REVIEW:
            review = _review(row, worker_id, advice, env)
            return replace(review, invoked=True, fault=reason, fault_bytes=needed)
    except DatabaseError as again:
        log.warning(
            "task %s step %s: the note could not be written either: %s",
            row.task_id,
            row.position,
            fault_reason(again),
        )
        if not connection.in_atomic_block:
            connection.close()
    return outcome


# Blobs this process wrote whose payload_persisted never committed, not yet
# written down as pending unlinks (the database refused that too).
_unnamed_blobs: set[str] = set()


def unnamed_blobs_record() -> None:
    """Write the blobs nothing names to the pending-unlink record (a worker's
    store came back); they are unlinked after the commit, under the guard."""
    if not _unnamed_blobs:
        return
    shas = sorted(_unnamed_blobs)
    with transaction.atomic():
        blobs_unlink_after_commit(shas=shas)
        transaction.on_commit(lambda: _unnamed_blobs.difference_update(shas))


def _record_failure(
    row: _StepRow, worker_id: str, error: str, rule: str
) -> StepOutcome:
    """The tool failed: retry after a back-off, or fail the step when out of attempts.

    The back-off (``tasks.faults.retry_delay``) is stored on the step as
    ``next_attempt_at``; the lease is released and the task queued, and no
    worker takes it again before then (``Task.objects.runnable``).
    """
    error = error[:1000]
    exhausted = row.attempts >= row.max_attempts
    now = timezone.now()
    delay = 0.0 if exhausted else retry_delay(row.attempts)
    next_at = now + timedelta(seconds=delay) if delay > 0 else None
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T_STEP} SET status = %s, error = %s, finished_at = %s, "
            f"next_attempt_at = %s WHERE id = %s",
            [
                Step.Status.FAILED if exhausted else Step.Status.PENDING,
                error,
                _dt(now),
                _dt(next_at) if next_at else None,
                row.id,
            ],
        )
        data: dict[str, Any] = {
            "attempt": row.attempts,
            "error": error[:500],
            "will_retry": not exhausted,
        }
        if next_at:
            data["retry_in_seconds"] = round(delay, 1)
            data["next_attempt_at"] = next_at.isoformat()
        entries = [(Event.Kind.TOOL_CALL_FAILED, row.id, data)]
        if exhausted:
            entries.append((Event.Kind.STEP_FAILED, row.id, {"attempts": row.attempts}))
            task_status = _close_task(
                cursor, row.task_id, worker_id, Task.Status.FAILED, entries
            )
        elif next_at:
            task_status = _close_task(
                cursor,
                row.task_id,
                worker_id,
                Task.Status.QUEUED,
                entries,
                reason="waiting to retry",
            )
        else:
            _append_held(cursor, row.task_id, worker_id, entries)
            task_status = Task.Status.RUNNING
    return StepOutcome(
        task_id=row.task_id,
        task_status=task_status,
        step_id=row.id,
        position=row.position,
        status=Step.Status.FAILED if exhausted else Step.Status.PENDING,
        invoked=True,
        rule=rule,
        error=error,
        next_attempt_at=next_at,
    )


def _finish(
    row: _StepRow,
    worker_id: str,
    payload: dict[str, Any],
    *,
    invoked: bool,
    rule: str = "",
    pre: list | None = None,
) -> StepOutcome:
    """Record the artifact, link it, mark the step done and log the result: one transaction."""
    now = timezone.now()
    meta = dict(payload.get("meta") or {})
    meta.setdefault("tool", row.tool)
    if payload.get("path"):
        meta["path"] = payload["path"]
    with transaction.atomic(), connection.cursor() as cursor:
        # Same guard as artifact_record: a GC cannot unlink this blob between
        # the check and the commit of the row that names it.
        blob_guard(payload["sha"])
        if not default_store().exists(payload["sha"]):
            raise BlobVanished(ERR_BLOB_VANISHED)
        ph = _json_ph()
        cursor.execute(
            f"INSERT INTO {T_ART} (sha256, size, media_type, artifact_class, title, meta, "
            f"integrity, verified_at, created_at) VALUES (%s, %s, %s, %s, %s, {ph}, 'ok', %s, %s) "
            f"ON CONFLICT (sha256) DO NOTHING RETURNING id",
            [
                payload["sha"],
                payload["size"],
                payload.get("media_type") or "application/octet-stream",
                row.artifact_class,
                payload.get("title", "")[:300],
                json.dumps(meta, default=str),
                _dt(now),
                _dt(now),
            ],
        )
        found = cursor.fetchone()
        if found is None:
            cursor.execute(
                f"SELECT id FROM {T_ART} WHERE sha256 = %s", [payload["sha"]]
            )
            found = cursor.fetchone()
        artifact_id = found[0]
        sources = [s for s in payload.get("source_ids") or [] if s != artifact_id]
        if sources:
            values = ", ".join(["(%s, %s, %s)"] * len(sources))
            params: list[Any] = []
            for i, sid in enumerate(sources):
                params += [artifact_id, sid, i]
            cursor.execute(
                f"INSERT INTO {T_SRC} (artifact_id, source_id, position) VALUES {values} "
                f"ON CONFLICT (artifact_id, source_id) DO NOTHING",
                params,
            )
        cursor.execute(
            f"INSERT INTO {T_LINK} (artifact_id, task_id, step_id, role, created_at) "
            f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT (task_id, artifact_id, role) DO NOTHING",
            [artifact_id, row.task_id, row.id, LinkRole.PERSISTED, _dt(now)],
        )
        cursor.execute(
            f"UPDATE {T_STEP} SET status = 'done', output_id = %s, finished_at = %s, "
            f"error = '' WHERE id = %s",
            [artifact_id, _dt(now), row.id],
        )
        ref = {
            "artifact_id": artifact_id,
            "sha": payload["sha"],
            "size": payload["size"],
            "class": row.artifact_class,
        }
        entries = [
            *(pre or []),
            (
                Event.Kind.TOOL_RESULT_PERSISTED,
                row.id,
                {**ref, "attempt": row.attempts},
            ),
        ]
        _, done, total = _append_held(
            cursor,
            row.task_id,
            worker_id,
            entries,
            extra_set=", steps_done = steps_done + 1",
        )
        task_status = Task.Status.RUNNING
        if done >= total:
            task_status = _close_task(
                cursor, row.task_id, worker_id, Task.Status.DONE, []
            )
    if payload.get("media_type") in WIDGET_MEDIA_TYPES:
        _widget_preview(row, artifact_id)
    return StepOutcome(
        task_id=row.task_id,
        task_status=task_status,
        step_id=row.id,
        position=row.position,
        status=Step.Status.DONE,
        invoked=invoked,
        rule=rule,
        artifact={
            "id": artifact_id,
            "sha256": payload["sha"],
            "class": row.artifact_class,
            "media_type": payload.get("media_type"),
            "size": payload["size"],
            "title": payload.get("title", ""),
        },
    )


def _widget_preview(row: _StepRow, artifact_id: int) -> None:
    """Render a widget output's PNG preview and let the task keep it.

    Runs after the step's result is committed: a preview is a view of the
    output, never part of it. It fails closed (the reason is recorded on the
    widget), and a crash here only leaves a widget without a picture, which the
    admin's re-render action fixes.
    """
    try:
        preview = preview_render(artifact=Artifact.objects.get(pk=artifact_id))
        if preview is not None:
            TaskArtifact.objects.get_or_create(
                task_id=row.task_id,
                artifact=preview,
                role=LinkRole.PERSISTED,
                defaults={"step_id": row.id},
            )
    except Exception:  # noqa: BLE001 - a preview never fails the step
        log.exception("preview of artifact %s failed", artifact_id)


def _resolve_uncertain(row: _StepRow, worker_id: str) -> StepOutcome:
    """Resolve an open envelope by the step's class (DESIGN.md's table)."""
    env = envelope_read(row.id)
    advice = uncertain_decide(row.as_step(), env)
    note = _note(advice, env, worker_id)
    if advice.action == ADOPT:
        payload = dict(env.payload)
        pre = [(Event.Kind.UNCERTAIN_RESOLVED, row.id, note)]
        try:
            _ensure_blob(row.artifact_class, payload)
            outcome = _finish(
                row, worker_id, payload, invoked=False, rule=advice.rule, pre=pre
            )
        except (DatabaseError, OSError, BlobVanished) as exc:
            # Nothing was recorded: the envelope stays open for the same
            # decision once the store takes writes again.
            if isinstance(exc, DatabaseError) and not connection.in_atomic_block:
                connection.close()
            reason = fault_reason(exc)
            return StepOutcome(
                task_id=row.task_id,
                task_status=Task.Status.RUNNING,
                step_id=row.id,
                position=row.position,
                status=Step.Status.RUNNING,
                rule=advice.rule,
                error=f"the saved output could not be recorded: {reason}",
                fault=reason,
            )
        crashpoint("after_result")
        return outcome
    if advice.action == CALL_AGAIN:
        with transaction.atomic(), connection.cursor() as cursor:
            pre = [(Event.Kind.UNCERTAIN_RESOLVED, row.id, note)]
            if row.attempts >= row.max_attempts:
                return _fail_exhausted(cursor, row, worker_id, pre)
            _start(cursor, row, worker_id, pre)
            crashpoint("before_started_commit")
        return _call(row, worker_id, rule=advice.rule)
    return _review(row, worker_id, advice, env)


def _note(advice, env: Envelope, worker_id: str) -> dict[str, Any]:
    return {
        "rule": advice.rule,
        "action": advice.action,
        "words": advice.words,
        "worker": worker_id,
        "had_payload": bool(env.payload),
    }


def _review(row: _StepRow, worker_id: str, advice, env: Envelope) -> StepOutcome:
    """Hand an open envelope to a person: the step and the task need review."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T_STEP} SET status = 'needs_review', error = %s WHERE id = %s",
            [advice.words, row.id],
        )
        entries = [
            (Event.Kind.UNCERTAIN_RESOLVED, row.id, _note(advice, env, worker_id)),
            (
                Event.Kind.STEP_NEEDS_REVIEW,
                row.id,
                {"reason": advice.words, "rule": advice.rule},
            ),
        ]
        status = _close_task(
            cursor, row.task_id, worker_id, Task.Status.NEEDS_REVIEW, entries
        )
    return StepOutcome(
        task_id=row.task_id,
        task_status=status,
        step_id=row.id,
        position=row.position,
        status=Step.Status.NEEDS_REVIEW,
        rule=advice.rule,
        error=advice.words,
    )


def _ensure_blob(artifact_class: int, payload: dict[str, Any]) -> None:
    """A class-1 file that is intact but whose blob copy is gone: copy it again."""
    store = default_store()
    if store.exists(payload["sha"]):
        return
    if artifact_class == ArtifactClass.FILE:
        path = class1_file(payload)
        if path is not None:
            with path.open("rb") as fh:
                store.put_file(fh)


# -- services around the step: release, pause, resume, retry, branch, resolve --


def _locked(task: Task) -> Task:
    return Task.objects.select_for_update().get(pk=task.pk)


def _refuse_live_lease(task: Task, actor: str = "") -> None:
    if task.lease_owner and not task.lease_expired and task.lease_owner != actor:
        raise ExecutorError(
            ERR_LEASE_HELD.format(
                owner=task.lease_owner,
                until=task.lease_expires_at.isoformat()
                if task.lease_expires_at
                else "?",
            )
        )


def _settle(
    task: Task, entries: list, *, actor: str = "", resume: bool = False
) -> Task:
    """Recompute a task's status and progress from its steps after a manual action.

    ``resume``: the action was a person's decision, which is also the go-ahead,
    so a paused task goes back to the worker queue instead of staying paused.
    """
    statuses = list(Step.objects.filter(task=task).values_list("status", flat=True))
    done = sum(1 for s in statuses if s in FINISHED)
    if Step.Status.NEEDS_REVIEW in statuses:
        status = Task.Status.NEEDS_REVIEW
    elif Step.Status.FAILED in statuses:
        status = Task.Status.FAILED
    elif done == len(statuses):
        status = Task.Status.DONE
    elif task.status == Task.Status.PAUSED and not resume:
        status = Task.Status.PAUSED
    else:
        status = Task.Status.QUEUED
    now = timezone.now()
    changes: dict[str, Any] = {"status": status, "steps_done": done, "updated_at": now}
    if status in (Task.Status.DONE, Task.Status.FAILED):
        changes["finished_at"] = task.finished_at or now
    else:
        changes["finished_at"] = None
    if status != task.status:
        if status == Task.Status.DONE:
            entries.append((Event.Kind.TASK_FINISHED, None, {"actor": actor}))
        elif status == Task.Status.QUEUED:
            reason = "decision" if resume else "settled"
            entries.append(
                (Event.Kind.TASK_QUEUED, None, {"actor": actor, "reason": reason})
            )
    Task.objects.filter(pk=task.pk).update(**changes)
    if entries:
        events_append(task_id=task.pk, entries=entries)
    task.refresh_from_db()
    return task


def _clear_stale_lease(task: Task, entries: list, actor: str) -> None:
    if task.lease_owner:
        entries.append(
            (
                Event.Kind.LEASE_RELEASED,
                None,
                {"previous_owner": task.lease_owner, "actor": actor, "forced": True},
            )
        )
        Task.objects.filter(pk=task.pk).update(lease_owner="", lease_expires_at=None)
        task.lease_owner = ""
        task.lease_expires_at = None


@transaction.atomic
def lease_release(*, task: Task, actor: str = "", force: bool = False) -> bool:
    """Release a task's lease; refuse a live lease held by someone else unless forced."""
    locked = _locked(task)
    if not locked.lease_owner:
        return False
    live = not locked.lease_expired
    if live and not force and actor != locked.lease_owner:
        _refuse_live_lease(locked, actor)
    changes: dict[str, Any] = {"lease_owner": "", "lease_expires_at": None}
    if locked.status == Task.Status.RUNNING:
        changes["status"] = Task.Status.QUEUED
    Task.objects.filter(pk=locked.pk).update(**changes)
    events_append(
        task_id=locked.pk,
        entries=[
            (
                Event.Kind.LEASE_RELEASED,
                None,
                {
                    "previous_owner": locked.lease_owner,
                    "actor": actor,
                    "forced": bool(force and live and actor != locked.lease_owner),
                },
            )
        ],
    )
    task.refresh_from_db()
    return True


@transaction.atomic
def task_pause(*, task: Task, actor: str = "") -> Task:
    """Take a queued or running task off the worker queue until it is resumed."""
    locked = _locked(task)
    if locked.status not in (Task.Status.QUEUED, Task.Status.RUNNING):
        raise ExecutorError(ERR_TASK_NOT_RUNNABLE.format(status=locked.status))
    entries: list = [(Event.Kind.TASK_PAUSED, None, {"actor": actor})]
    if locked.lease_expired:
        _clear_stale_lease(locked, entries, actor)
    Task.objects.filter(pk=locked.pk).update(
        status=Task.Status.PAUSED, updated_at=timezone.now()
    )
    events_append(task_id=locked.pk, entries=entries)
    task.refresh_from_db()
    return task


@transaction.atomic
def task_cancel(*, task: Task, actor: str = "") -> Task:
    """Stop an unfinished task for good, effective at the next step boundary.

    A call in flight finishes and its result is saved (its worker still holds
    the lease); the executor then starts no further step and gives the lease
    back. Nothing is deleted: the steps and outputs stay, and a branch can
    continue from any finished step.
    """
    locked = _locked(task)
    if locked.status not in TASK_OPEN:
        raise ExecutorError(
            ERR_NOT_CANCELLABLE.format(status=locked.get_status_display())
        )
    in_flight = bool(locked.lease_owner) and not locked.lease_expired
    entries: list = [
        (
            Event.Kind.TASK_CANCELLED,
            None,
            {"actor": actor, "previous_status": locked.status, "in_flight": in_flight},
        )
    ]
    if locked.lease_owner and not in_flight:
        _clear_stale_lease(locked, entries, actor)
    now = timezone.now()
    Task.objects.filter(pk=locked.pk).update(
        status=Task.Status.CANCELLED, updated_at=now, finished_at=now
    )
    events_append(task_id=locked.pk, entries=entries)
    task.refresh_from_db()
    return task


def _refuse_cancelled(task: Task) -> None:
    if task.status == Task.Status.CANCELLED:
        raise ExecutorError(ERR_TASK_CANCELLED)


@transaction.atomic
def task_resume(*, task: Task, actor: str = "") -> Task:
    """Queue a paused or interrupted task for a worker; log who asked."""
    locked = _locked(task)
    if locked.status == Task.Status.DONE:
        raise ExecutorError(ERR_TASK_DONE)
    _refuse_cancelled(locked)
    blocked = (
        Step.objects.filter(
            task=locked, status__in=[Step.Status.FAILED, Step.Status.NEEDS_REVIEW]
        )
        .order_by("position")
        .first()
    )
    if blocked is not None:
        raise ExecutorError(
            ERR_RESUME_BLOCKED.format(
                position=blocked.position, status=blocked.get_status_display()
            )
        )
    entries: list = []
    if locked.lease_expired:
        _clear_stale_lease(locked, entries, actor)
    # A worker still holding a live lease (paused mid-step) simply carries on:
    # its next renewal accepts a queued task.
    Task.objects.filter(pk=locked.pk).update(
        status=Task.Status.QUEUED, updated_at=timezone.now(), finished_at=None
    )
    entries.append((Event.Kind.TASK_QUEUED, None, {"actor": actor, "reason": "resume"}))
    events_append(task_id=locked.pk, entries=entries)
    task.refresh_from_db()
    return task


@transaction.atomic
def step_retry(*, step: Step, actor: str = "") -> Step:
    """Run a failed or needs-review step again, as a new generation.

    The new generation gives the call a new idempotency key; earlier outputs
    (a class-3 snapshot, say) stay linked to the task as history.
    """
    task = _locked(step.task)
    _refuse_cancelled(task)
    current = Step.objects.get(pk=step.pk)
    if current.status not in (Step.Status.FAILED, Step.Status.NEEDS_REVIEW):
        raise ExecutorError(
            ERR_NOT_RETRYABLE.format(
                position=current.position, status=current.get_status_display()
            )
        )
    _refuse_live_lease(task, actor)
    entries: list = []
    if task.lease_owner:
        _clear_stale_lease(task, entries, actor)
    Step.objects.filter(pk=current.pk).update(
        status=Step.Status.PENDING,
        attempts=0,
        generation=current.generation + 1,
        next_attempt_at=None,
        error="",
        output=None,
        started_at=None,
        finished_at=None,
    )
    entries.append(
        (
            Event.Kind.STEP_RETRIED,
            current.pk,
            {
                "actor": actor,
                "previous_status": current.status,
                "generation": current.generation + 1,
                "previous_output": current.output_id,
            },
        )
    )
    _settle(task, entries, actor=actor, resume=True)
    step.refresh_from_db()
    return step


@transaction.atomic
def task_branch(*, task: Task, after_position: int, actor: str = "") -> Task:
    """Make a new task in the same conversation keeping steps 1..k and their outputs."""
    source = Task.objects.get(pk=task.pk)
    steps = list(Step.objects.filter(task=source).order_by("position"))
    if not 0 <= after_position <= len(steps):
        raise ExecutorError(ERR_BRANCH_POSITION.format(total=len(steps)))
    if after_position == len(steps):
        raise ExecutorError(ERR_BRANCH_NOTHING)
    for s in steps[:after_position]:
        if s.status not in FINISHED:
            raise ExecutorError(
                ERR_BRANCH_UNFINISHED.format(
                    position=s.position, status=s.get_status_display()
                )
            )
    now = timezone.now()
    kept = steps[:after_position]
    done = len(kept)
    status = Task.Status.DONE if done == len(steps) else Task.Status.QUEUED
    branch = Task.objects.create(
        conversation_id=source.conversation_id,
        title=f"{source.title} (branch after step {after_position})"[:300],
        brain=source.brain,
        status=status,
        steps_total=len(steps),
        steps_done=done,
        branched_from=source,
        branched_at=after_position,
        created_at=now,
        updated_at=now,
        finished_at=now if status == Task.Status.DONE else None,
    )
    new_steps = []
    for s in steps:
        keep = s.position <= after_position
        new_steps.append(
            Step(
                task=branch,
                position=s.position,
                title=s.title,
                tool=s.tool,
                args=s.args,
                artifact_class=s.artifact_class,
                side_effects=s.side_effects,
                max_attempts=s.max_attempts,
                status=s.status if keep else Step.Status.PENDING,
                attempts=s.attempts if keep else 0,
                generation=s.generation if keep else 0,
                output_id=s.output_id if keep else None,
                started_at=s.started_at if keep else None,
                finished_at=s.finished_at if keep else None,
                created_at=now,
            )
        )
    created = Step.objects.bulk_create(new_steps)
    TaskArtifact.objects.bulk_create(
        [
            TaskArtifact(
                artifact_id=ns.output_id,
                task=branch,
                step=ns,
                role=LinkRole.REFERENCED,
                created_at=now,
            )
            for ns in created
            if ns.output_id
        ]
    )
    branch_entries = [
        (
            Event.Kind.TASK_CREATED,
            None,
            {"steps": len(steps), "brain": branch.brain, "title": branch.title[:200]},
        ),
        (
            Event.Kind.TASK_BRANCHED,
            None,
            {
                "branched_from": source.pk,
                "after_position": after_position,
                "actor": actor,
            },
        ),
    ]
    if status == Task.Status.QUEUED:
        branch_entries.append((Event.Kind.TASK_QUEUED, None, {"reason": "branch"}))
    events_append(task_id=branch.pk, entries=branch_entries)
    events_append(
        task_id=source.pk,
        entries=[
            (
                Event.Kind.TASK_BRANCHED,
                None,
                {"branch": branch.pk, "after_position": after_position, "actor": actor},
            )
        ],
    )
    return branch


def step_resolve_options(step: Step) -> list[str]:
    """Return the actions the class rules allow for a failed or uncertain step."""
    step = Step.objects.select_related("task").get(pk=step.pk)
    if step.status == Step.Status.FAILED:
        return ["rerun", "skip"]
    uncertain_running = step.status == Step.Status.RUNNING and not (
        step.task.lease_owner and not step.task.lease_expired
    )
    if step.status != Step.Status.NEEDS_REVIEW and not uncertain_running:
        return []
    env = envelope_read(step.pk)
    if uncertain_running and not env.open:
        return []
    return _review_options(step, env)


def _review_options(step: Step, env: Envelope) -> list[str]:
    options = []
    if env.payload and payload_intact(step.artifact_class, env.payload):
        options.append("adopt")
    persisted = bool(env.payload and env.payload.get("sha"))
    if step.side_effects:
        # A person decides; the call goes out again with the same idempotency key.
        options.append("rerun")
    elif step.artifact_class == ArtifactClass.SNAPSHOT and persisted:
        pass  # a persisted snapshot is never taken twice (retry makes a new one)
    elif step.artifact_class == ArtifactClass.RENDER and not sources_alive(
        source_ids_for(step, env.payload)
    ):
        pass  # a render from dead sources would not be the same render
    else:
        options.append("rerun")
    options += ["fail", "skip"]
    return options


@transaction.atomic
def step_resolve(*, step: Step, action: str, actor: str = "") -> Step:
    """Resolve a failed or uncertain step by hand: adopt, rerun, fail or skip.

    The decision is also the go-ahead: a paused task is queued for the worker
    (unless the decision leaves it failed or finished).
    """
    if action not in ACTIONS:
        raise ExecutorError(ERR_ACTION_UNKNOWN.format(action=action))
    task = _locked(step.task)
    _refuse_cancelled(task)
    _refuse_live_lease(task, actor)
    allowed = step_resolve_options(step)
    current = Step.objects.get(pk=step.pk)
    if action not in allowed:
        raise ExecutorError(
            ERR_ACTION_NOT_ALLOWED.format(
                action=action,
                position=current.position,
                allowed=", ".join(allowed) or "none",
            )
        )
    entries: list = []
    if task.lease_owner:
        _clear_stale_lease(task, entries, actor)
    note = {"action": action, "rule": f"operator_{action}", "actor": actor}
    if action == "adopt":
        env = envelope_read(current.pk)
        row = _row_of(current)
        payload = dict(env.payload)
        _ensure_blob(row.artifact_class, payload)
        if entries:
            events_append(task_id=task.pk, entries=entries)
            entries = []
        # Hold a lease named after the actor for the one transaction of _finish.
        holder = actor or "operator"
        Task.objects.filter(pk=task.pk).update(
            lease_owner=holder, lease_expires_at=_lease_until()
        )
        Step.objects.filter(pk=current.pk).update(status=Step.Status.RUNNING)
        _finish(
            row,
            holder,
            payload,
            invoked=False,
            rule="operator_adopt",
            pre=[(Event.Kind.STEP_RESOLVED, current.pk, note)],
        )
        Task.objects.filter(pk=task.pk, lease_owner=holder).update(
            lease_owner="", lease_expires_at=None
        )
        task.refresh_from_db()
    elif action == "rerun":
        Step.objects.filter(pk=current.pk).update(
            status=Step.Status.PENDING,
            attempts=min(current.attempts, current.max_attempts - 1),
            next_attempt_at=None,
            error="",
        )
        entries.append((Event.Kind.STEP_RESOLVED, current.pk, note))
    elif action == "fail":
        Step.objects.filter(pk=current.pk).update(
            status=Step.Status.FAILED, finished_at=timezone.now()
        )
        entries += [
            (Event.Kind.STEP_RESOLVED, current.pk, note),
            (Event.Kind.STEP_FAILED, current.pk, {"actor": actor}),
        ]
    else:  # skip
        Step.objects.filter(pk=current.pk).update(
            status=Step.Status.SKIPPED, finished_at=timezone.now()
        )
        entries += [
            (Event.Kind.STEP_RESOLVED, current.pk, note),
            (Event.Kind.STEP_SKIPPED, current.pk, {"actor": actor}),
        ]
    _settle(task, entries, actor=actor, resume=True)
    step.refresh_from_db()
    return step


def _row_of(step: Step) -> _StepRow:
    return _StepRow(
        id=step.pk,
        task_id=step.task_id,
        position=step.position,
        title=step.title,
        status=step.status,
        tool=step.tool,
        args=step.args or {},
        artifact_class=step.artifact_class,
        side_effects=step.side_effects,
        attempts=step.attempts,
        max_attempts=step.max_attempts,
        generation=step.generation,
    )
