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
8. The lease was renewed at the step's start (and by the keeper through the
   call) and checked by every write; it is released when the task stops being
   runnable (done, failed, needs review).

Every write after the lease is taken is conditional on still holding it, so a
worker that lost its lease cannot record a result. The hot path uses a few
hand-written statements (one ``UPDATE … RETURNING`` per transaction reserves
the event sequence numbers and renews the lease at once); see
``bench/bench_executor.py``.

Each boundary has a crash point (``tasks.crashpoints``) that tests and the
demo arm to kill the process there. Leases are ``tasks.lease``; what a person
does to a task (pause, resume, retry, branch, resolve) is ``tasks.actions``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from artifacts.gc import blobs_unlink_after_commit
from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from artifacts.preview import WIDGET_MEDIA_TYPES
from artifacts.services import (
    BlobVanished,
    artifact_insert,
    sources_check,
)
from artifacts.store import PutResult, default_store, sha256_bytes
from pippa_site.hotsql import db_datetime, hot_atomic, hot_cursor, utc_now
from tasks.crashpoints import crashpoint
from tasks.faults import REASON_DISK_FULL, fault_reason, retry_delay
from tasks.lease import (
    Lease,
    LeaseLost,
    lease_append,
    lease_close,
    lease_close_stopped,
    lease_keeper,
    lease_lent,
    lease_take,
    lease_unreserve,
    parse_dt,
)
from tasks.models import Conversation, Event, LinkRole, Step, Task, TaskArtifact
from tasks.notify import notify_step_waiting
from tasks.resume import (
    ADOPT,
    CALL_AGAIN,
    REVIEW,
    Envelope,
    class1_file,
    envelope_read,
    uncertain_decide,
)
from tasks.services import events_insert, task_widget_preview
from tasks.tools import ToolContext, ToolResult, files_root, tool_get

log = logging.getLogger("pippa.executor")

ERR_NO_OUTPUT = "the tool returned no payload"
ERR_FILE_OUTSIDE = "a class-1 tool must write its file under the files folder"
ERR_UNSAVED = "the tool ran; its output could not be saved: {reason}"
ERR_WAITING = "waiting before attempt {attempt}: next attempt {when}"

MAX_PAYLOAD_META_CHARS = 1500
# ``payload_persisted`` data of an output kept in the database (``put_inline``).
STORED_INLINE = "inline"


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
    # The conversation's owner: the owner of every artifact row this step writes.
    owner_id: int
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


# -- SQL of the hot path ------------------------------------------------------

T_TASK = Task._meta.db_table
T_CONV = Conversation._meta.db_table
T_STEP = Step._meta.db_table
T_LINK = TaskArtifact._meta.db_table
T_ART = Artifact._meta.db_table
T_SRC = ArtifactSource._meta.db_table
# Statuses of a finished step (``StepStatus.finished``), as an SQL list.
FINISHED_SQL = Step.Status.finished_sql()


_dt = db_datetime


def _loads(value: Any) -> Any:
    if isinstance(value, (str, bytes, bytearray)):
        return json.loads(value)
    return value


def _next_step(cursor, task_id: int) -> _StepRow | None:
    cursor.execute(
        f"SELECT s.id, s.position, s.title, s.status, s.tool, s.args, "
        f"s.artifact_class, s.side_effects, s.attempts, s.max_attempts, "
        f"s.generation, c.owner_id, s.next_attempt_at FROM {T_STEP} s "
        f"JOIN {T_TASK} t ON t.id = s.task_id JOIN {T_CONV} c ON c.id = t.conversation_id "
        f"WHERE s.task_id = %s AND s.status NOT IN {FINISHED_SQL} "
        f"ORDER BY s.position LIMIT 1",
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
        owner_id=row[11],
        next_attempt_at=parse_dt(row[12]),
    )


# -- the step -----------------------------------------------------------------


def step(*, task_id: int, worker_id: str) -> StepOutcome | None:
    """Run one step of one task; None when the lease is held elsewhere or the task is idle.

    See the module docstring for the numbered state machine. The common case
    (our lease, the next step pending and due) is three statements before the
    call: the renewal reserving the event's seq, one ``UPDATE … RETURNING``
    that picks and starts the step, and the event.
    """
    with hot_atomic(), hot_cursor() as cursor:
        lease = lease_take(cursor, task_id, worker_id, reserve=1)
        if lease is None:
            lease_close_stopped(cursor, task_id, worker_id)
            return None
        row = _start_next(cursor, task_id, worker_id, lease) if lease.reserved else None
        if row is None:
            lease_unreserve(cursor, task_id, lease)
            picked = _pick(cursor, task_id, worker_id, lease)
            if isinstance(picked, StepOutcome):
                return picked
            row, uncertain = picked
        else:
            uncertain = False
        if not uncertain:
            crashpoint("before_started_commit")
    if uncertain:
        return _resolve_uncertain(row, worker_id)
    return _call(row, worker_id)


def _pick(
    cursor, task_id: int, worker_id: str, lease: Lease
) -> StepOutcome | tuple[_StepRow, bool]:
    """Every case but the common one: finished, stopped, uncertain, waiting, exhausted.

    Return the outcome, or the step to go on with and whether it is uncertain.
    """
    row = _next_step(cursor, task_id)
    if row is None:
        status = lease_close(
            cursor, task_id, worker_id, Task.Status.DONE, lease.entries
        )
        return StepOutcome(task_id=task_id, task_status=status)
    if row.status in (Step.Status.NEEDS_REVIEW, Step.Status.FAILED):
        task_status = (
            Task.Status.FAILED
            if row.status == Step.Status.FAILED
            else Task.Status.NEEDS_REVIEW
        )
        status = lease_close(cursor, task_id, worker_id, task_status, lease.entries)
        return StepOutcome(
            task_id=task_id,
            task_status=status,
            step_id=row.id,
            position=row.position,
            status=row.status,
        )
    if row.status == Step.Status.RUNNING:
        if lease.entries:
            lease_append(cursor, task_id, worker_id, lease.entries)
        return row, True
    if row.next_attempt_at and row.next_attempt_at > timezone.now():
        return _waiting(cursor, row, worker_id, lease)
    if row.attempts >= row.max_attempts:
        return _fail_exhausted(cursor, row, worker_id, lease.entries)
    _start(cursor, row, worker_id, lease.entries)
    return row, False


def _start_next(cursor, task_id: int, worker_id: str, lease: Lease) -> _StepRow | None:
    """The common case in one statement: pick the next step, if it is pending,
    due and has attempts left, count the attempt and mark it running; then log
    ``tool_call_started`` under the seq the lease renewal reserved.
    None (nothing written) for every other case.
    """
    moment = utc_now()
    now = _dt(moment)
    cursor.execute(
        f"UPDATE {T_STEP} SET status = 'running', attempts = attempts + 1, "
        f"started_at = %s, finished_at = NULL, next_attempt_at = NULL "
        f"WHERE id = (SELECT id FROM {T_STEP} WHERE task_id = %s "
        f"AND status NOT IN {FINISHED_SQL} ORDER BY position LIMIT 1) "
        f"AND status = 'pending' AND attempts < max_attempts "
        f"AND (next_attempt_at IS NULL OR next_attempt_at <= %s) "
        f"RETURNING id, position, title, tool, args, artifact_class, side_effects, "
        f"attempts, max_attempts, generation, "
        # The owner's artifact rows receive the output (artifact_insert).
        f"(SELECT c.owner_id FROM {T_TASK} t JOIN {T_CONV} c "
        f"ON c.id = t.conversation_id WHERE t.id = %s)",
        [now, task_id, now, task_id],
    )
    found = cursor.fetchone()
    if found is None:
        return None
    row = _StepRow(
        id=found[0],
        task_id=task_id,
        position=found[1],
        title=found[2],
        status=Step.Status.RUNNING,
        tool=found[3],
        args=_loads(found[4]) or {},
        artifact_class=found[5],
        side_effects=bool(found[6]),
        attempts=found[7],
        max_attempts=found[8],
        generation=found[9],
        owner_id=found[10],
    )
    events_insert(
        task_id=task_id,
        first_seq=lease.last_seq,
        entries=[_started_entry(row, worker_id)],
        created_at=moment,
    )
    lease.reserved = 0
    return row


def _waiting(cursor, row: _StepRow, worker_id: str, lease: Lease) -> StepOutcome:
    """The step is waiting out its back-off: take nothing, say until when."""
    if lease.entries:
        # The lease was only just taken for this look: leave no trace of it.
        transaction.set_rollback(True)
        task_status = Task.Status.QUEUED
    else:
        task_status = lease_close(
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


def _start(cursor, row: _StepRow, worker_id: str, pre: list) -> None:
    """Count the attempt and log ``tool_call_started`` (caller commits it)."""
    cursor.execute(
        f"UPDATE {T_STEP} SET status = 'running', attempts = attempts + 1, "
        f"started_at = %s, finished_at = NULL, next_attempt_at = NULL WHERE id = %s",
        [_dt(timezone.now()), row.id],
    )
    row.attempts += 1
    row.status = Step.Status.RUNNING
    lease_append(
        cursor,
        row.task_id,
        worker_id,
        [*pre, _started_entry(row, worker_id)],
    )


def _started_entry(row: _StepRow, worker_id: str) -> tuple:
    return (
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
    )


def _fail_exhausted(cursor, row: _StepRow, worker_id: str, pre: list) -> StepOutcome:
    cursor.execute(
        f"UPDATE {T_STEP} SET status = 'failed', finished_at = %s WHERE id = %s",
        [_dt(timezone.now()), row.id],
    )
    notify_step_waiting(step_id=row.id, owner_id=row.owner_id, reason="failed")
    entries = [
        *pre,
        (
            Event.Kind.STEP_FAILED,
            row.id,
            {"attempts": row.attempts, "reason": "no attempts left"},
        ),
    ]
    status = lease_close(cursor, row.task_id, worker_id, Task.Status.FAILED, entries)
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
    keeper = lease_keeper() if not connection.in_atomic_block else None
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
        # A tool that met a full disk (its own file under the files root) has
        # failed, but the worker must not retry into the same full disk: the
        # outcome carries the fault, and the worker backs off and probes.
        full = fault_reason(failure) == REASON_DISK_FULL
        return _record_failure(
            row,
            worker_id,
            f"{type(failure).__name__}: {failure}",
            rule,
            fault=REASON_DISK_FULL if full else "",
        )
    if unsaved is not None:
        return _output_unsaved(
            row, worker_id, unsaved, stage="blob", needed=needed, rule=rule
        )
    inline = payload.get("stored") == STORED_INLINE
    try:
        with hot_atomic(), hot_cursor() as cursor:
            if inline:  # the bytes commit with the event that names them
                default_store().put_inline(output.data, sha=payload["sha"])
            lease_append(
                cursor,
                row.task_id,
                worker_id,
                [(Event.Kind.PAYLOAD_PERSISTED, row.id, payload)],
                renew=False,  # C1 renewed it, the lease keeper through the call
            )
    except DatabaseError as exc:
        written = "" if inline else payload["sha"]
        return _output_unsaved(
            row, worker_id, exc, stage="payload", rule=rule, written=written
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
    if result.source_ids:
        # Lineage joins only the owner's rows: a source that is not one of
        # them is refused like an unknown id, before anything is stored.
        result.source_ids = sources_check(
            owner_id=row.owner_id, source_ids=list(result.source_ids)[:50]
        )
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
    store = default_store()
    inline = output.path is None and store.inline_fits(output.size)
    if output.path is not None:
        with output.path.open("rb") as fh:
            put = store.put_file(fh)
    elif inline:  # written with payload_persisted, in its transaction
        put = PutResult(sha256_bytes(output.data), output.size, created=True)
    else:
        put = store.put_bytes(output.data)
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
    if inline:
        payload["stored"] = STORED_INLINE
    if output.rel_path:
        payload["path"] = output.rel_path
    if result.source_ids:
        payload["source_ids"] = [int(x) for x in result.source_ids]
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
        with transaction.atomic(), hot_cursor() as cursor:
            unnamed_blobs_record()
            lease_append(
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
    row: _StepRow, worker_id: str, error: str, rule: str, *, fault: str = ""
) -> StepOutcome:
    """The tool failed: retry after a back-off, or fail the step when out of attempts.

    The back-off (``tasks.faults.retry_delay``) is stored on the step as
    ``next_attempt_at``; the lease is released and the task queued, and no
    worker takes it again before then (``Task.objects.runnable``). A ``fault``
    (the tool met a full disk) is named in the event and handed to the
    worker, which stops stepping until its store probe passes.
    """
    error = error[:1000]
    exhausted = row.attempts >= row.max_attempts
    now = timezone.now()
    delay = 0.0 if exhausted else retry_delay(row.attempts)
    next_at = now + timedelta(seconds=delay) if delay > 0 else None
    with transaction.atomic(), hot_cursor() as cursor:
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
        if fault:
            data["reason"] = fault
        if next_at:
            data["retry_in_seconds"] = round(delay, 1)
            data["next_attempt_at"] = next_at.isoformat()
        entries = [(Event.Kind.TOOL_CALL_FAILED, row.id, data)]
        if exhausted:
            notify_step_waiting(step_id=row.id, owner_id=row.owner_id, reason="failed")
            entries.append((Event.Kind.STEP_FAILED, row.id, {"attempts": row.attempts}))
            task_status = lease_close(
                cursor, row.task_id, worker_id, Task.Status.FAILED, entries
            )
        elif next_at:
            task_status = lease_close(
                cursor,
                row.task_id,
                worker_id,
                Task.Status.QUEUED,
                entries,
                reason="waiting to retry",
            )
        else:
            lease_append(cursor, row.task_id, worker_id, entries)
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
        fault=fault,
    )


def _finish(
    row: _StepRow,
    worker_id: str,
    payload: dict[str, Any],
    *,
    invoked: bool,
    rule: str = "",
    pre: list | None = None,
    preview: bool = True,
) -> StepOutcome:
    """Record the artifact, link it, mark the step done and log the result: one transaction.

    A widget's preview is rendered after that commit (``preview``), or by a
    caller inside a transaction of its own once that one commits.
    """
    with hot_atomic(), hot_cursor() as cursor:
        artifact_id = _artifact_record(row, payload)
        task_status = _step_done(cursor, row, worker_id, artifact_id, payload, pre)
    outcome = StepOutcome(
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
    if preview:
        outcome_preview(outcome)
    return outcome


def _artifact_record(row: _StepRow, payload: dict[str, Any]) -> int:
    """The task owner's artifact row for the persisted payload (reused if there)."""
    meta = dict(payload.get("meta") or {})
    meta.setdefault("tool", row.tool)
    if payload.get("path"):
        meta["path"] = payload["path"]
    return artifact_insert(
        owner_id=row.owner_id,
        sha256=payload["sha"],
        size=payload["size"],
        media_type=payload.get("media_type") or "application/octet-stream",
        artifact_class=row.artifact_class,
        title=payload.get("title", ""),
        meta=meta,
        source_ids=payload.get("source_ids") or (),
        inline=payload.get("stored") == STORED_INLINE,
    ).id


def _step_done(
    cursor,
    row: _StepRow,
    worker_id: str,
    artifact_id: int,
    payload: dict[str, Any],
    pre: list | None,
) -> str:
    """Link the output, mark the step done, log ``tool_result_persisted`` under
    the lease; close the task when it was the last step. Return its status."""
    now = _dt(utc_now())
    cursor.execute(
        f"INSERT INTO {T_LINK} (artifact_id, task_id, step_id, role, created_at) "
        f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT (task_id, artifact_id, role) DO NOTHING",
        [artifact_id, row.task_id, row.id, LinkRole.PERSISTED, now],
    )
    cursor.execute(
        f"UPDATE {T_STEP} SET status = 'done', output_id = %s, finished_at = %s, "
        f"error = '' WHERE id = %s",
        [artifact_id, now, row.id],
    )
    result = {
        "artifact_id": artifact_id,
        "sha": payload["sha"],
        "size": payload["size"],
        "class": row.artifact_class,
        "attempt": row.attempts,
    }
    entries = [*(pre or []), (Event.Kind.TOOL_RESULT_PERSISTED, row.id, result)]
    _, done, total = lease_append(
        cursor,
        row.task_id,
        worker_id,
        entries,
        extra_set=", steps_done = steps_done + 1",
        # The next step's start renews it; a worker that moves on leaves it
        # to run out from there, not a full lease later.
        renew=False,
    )
    if done < total:
        return Task.Status.RUNNING
    return lease_close(cursor, row.task_id, worker_id, Task.Status.DONE, [])


def outcome_preview(outcome: StepOutcome) -> None:
    """Render a widget output's PNG preview after its result committed.

    ``tasks.services.task_widget_preview`` does it, the same function the API
    uses for an uploaded widget: a preview is a view of the output, never part
    of it (rendering takes up to seconds, and must not hold the task's row or
    SQLite's write lock); it fails closed with the reason on the widget.
    """
    artifact = outcome.artifact
    if not artifact or artifact.get("media_type") not in WIDGET_MEDIA_TYPES:
        return
    task_widget_preview(
        artifact_id=artifact["id"], task_id=outcome.task_id, step_id=outcome.step_id
    )


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
        with transaction.atomic(), hot_cursor() as cursor:
            pre = [(Event.Kind.UNCERTAIN_RESOLVED, row.id, note)]
            # An output the executor could not save (disk full, database
            # gone) is not the tool failing: it does not use up the attempts.
            if row.attempts >= row.max_attempts and not env.unsaved:
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
    with transaction.atomic(), hot_cursor() as cursor:
        cursor.execute(
            f"UPDATE {T_STEP} SET status = 'needs_review', error = %s WHERE id = %s",
            [advice.words, row.id],
        )
        notify_step_waiting(
            step_id=row.id, owner_id=row.owner_id, reason="needs_review"
        )
        entries = [
            (Event.Kind.UNCERTAIN_RESOLVED, row.id, _note(advice, env, worker_id)),
            (
                Event.Kind.STEP_NEEDS_REVIEW,
                row.id,
                {"reason": advice.words, "rule": advice.rule},
            ),
        ]
        status = lease_close(
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


def step_adopt(*, step: Step, holder: str, pre: list) -> StepOutcome:
    """Record the payload an open envelope persisted as the step's output.

    An operator's "adopt": the hot path's own result transaction, under a
    lease lent to ``holder`` (the caller holds the task's row lock). The
    preview is left to the caller, to render once its transaction commits.
    """
    env = envelope_read(step.pk)
    row = _row_of(step)
    payload = dict(env.payload)
    _ensure_blob(row.artifact_class, payload)
    with lease_lent(task_id=step.task_id, holder=holder):
        Step.objects.filter(pk=step.pk).update(status=Step.Status.RUNNING)
        return _finish(
            row,
            holder,
            payload,
            invoked=False,
            rule="operator_adopt",
            pre=pre,
            preview=False,
        )


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
        owner_id=Conversation.objects.filter(tasks__pk=step.task_id)
        .values_list("owner_id", flat=True)
        .get(),
    )
