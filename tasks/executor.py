"""The step executor: one step of one task, by one worker, durable at every boundary.

``step(task_id=…, worker_id=…)``, in two commits:

1. Take the task's lease in one conditional UPDATE (ours, free, or expired;
   a takeover logs ``lease_taken_over`` naming the previous owner).
2. Rehydrate now, and only here: pick the first step that is not done.
3. A step still ``running`` has an open envelope (``tool_call_started`` with no
   closing event): the uncertain state. Resolve it by its class
   (``tasks.resume.uncertain_decide``), never by blindly re-running.
4. Otherwise count the attempt and log ``tool_call_started``: **commit 1**.
   For a tool with outside effects that commit is on disk before the call
   (SQLite ``synchronous=FULL`` for that transaction; PostgreSQL's worker
   connection runs with ``synchronous_commit`` on); for any other tool it may
   ride on the next sync (losing it re-runs a call whose result was never
   shown).
5. Call the tool with a context carrying the idempotency key
   ``pippa:<task>:<step>:<generation>`` (only an explicit retry bumps the
   generation, so a resumed uncertain call keeps its key).
6. Write the payload as a content-addressed file (a file with no name,
   linked under its sha, then the file and its folder fsynced): every output
   is a file, whatever its size.
7. **Commit 2**, durable (``synchronous=FULL``): ``payload_persisted`` (sha)
   and ``tool_result_persisted``, the artifact row, the ownership link, the
   step's output ref and ``done``, and the plan's advance (``steps_done``;
   the task's close after its last step). Only then return the result.
8. The lease was renewed at the step's start (and by the keeper through the
   call) and checked by every write; it is released when the task stops being
   runnable (done, failed, needs review).

A crash between 6 and 7 leaves a file no row names (the doctor sweeps it)
and an open envelope with no payload, which the class rules settle: the call
is made again unless it has outside effects, in which case a person decides.

Every write after the lease is taken is conditional on still holding it, so a
worker that lost its lease cannot record anything. The statements are
``tasks.statements``'s; the transactions are Django's
(``transaction.atomic(durable=True)`` for a worker's commits).

Each boundary has a crash point (``tasks.crashpoints``) that tests and the
demo arm to kill the process there. Leases are ``tasks.lease``; what a person
does to a task (pause, resume, retry, branch, resolve) is ``tasks.actions``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from artifacts.gc import blobs_unlink_after_commit
from artifacts.models import ArtifactClass
from artifacts.preview import WIDGET_MEDIA_TYPES
from artifacts.quota import QuotaExceeded, quota_admit
from artifacts.services import (
    MAX_SOURCES,
    BlobVanished,
    artifact_insert,
    sources_check,
)
from artifacts.store import default_store
from pippa_site import metrics
from pippa_site.errors import Conflict
from tasks import statements as sql
from tasks.crashpoints import crashpoint
from tasks.faults import REASON_DISK_FULL, fault_reason, retry_delay
from tasks.hooks import step_waiting_send
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
)
from tasks.models import Conversation, Event, LinkRole, Step, Task
from tasks.resume import (
    ADOPT,
    CALL_AGAIN,
    REVIEW,
    Envelope,
    ResumeAdvice,
    class1_file,
    envelope_read,
    uncertain_decide,
)
from tasks.services import task_widget_preview
from tasks.statements import StepRow, step_row
from tasks.tools import ToolContext, ToolResult, files_root, tool_get

log = logging.getLogger("pippa.executor")

ERR_NO_OUTPUT = "the tool returned no payload"
ERR_FILE_OUTSIDE = "a class-1 tool must write its file under the files folder"
ERR_UNSAVED = "the tool ran; its output could not be saved: {reason}"
ERR_WAITING = "waiting before attempt {attempt}: next attempt {when}"

MAX_PAYLOAD_META_CHARS = 1500

S = Step.Status
# SQLite's sync level for a commit that must be on disk before what follows
# (a call with outside effects, a result shown), and for one that may ride
# on the next sync (``tasks.statements.synchronous``).
DURABLE, RELAXED = "FULL", "NORMAL"


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


_dt = sql.db_datetime


# -- the step -----------------------------------------------------------------


def step(*, task_id: int, worker_id: str) -> StepOutcome | None:
    """Run one step of one task; None when the lease is held elsewhere or the task is idle.

    See the module docstring for the numbered state machine. The common case
    (our lease, the next step pending and due) is four statements before the
    call: the renewal reserving the event's seq, one ``UPDATE … RETURNING``
    that picks and starts the step, and the event; commit 1.
    """
    started = time.perf_counter()
    picked = _begin(task_id, worker_id, durable=False)
    if picked is _EFFECTS:
        # The step has outside effects: its start goes to disk before the call.
        picked = _begin(task_id, worker_id, durable=True)
    if picked is None or isinstance(picked, StepOutcome):
        return picked
    row, uncertain = picked
    if uncertain:
        outcome = _resolve_uncertain(row, worker_id)
    else:
        outcome = _call(row, worker_id)
    _observed(row, outcome, time.perf_counter() - started)
    return outcome


def _observed(row: StepRow, outcome: StepOutcome, seconds: float) -> None:
    """Count the step (``pippa_site.metrics``): after its commits, never before."""
    metrics.step_observed(
        artifact_class=row.artifact_class,
        tool=row.tool,
        status=outcome.status,
        invoked=outcome.invoked,
        rule=outcome.rule,
        seconds=seconds,
        tool_failed=outcome.invoked and outcome.status in (S.PENDING, S.FAILED),
    )


_EFFECTS = object()  # _begin's answer: start this step again at DURABLE


def _begin(task_id: int, worker_id: str, *, durable: bool):
    """Commit 1: take the lease, pick the step, log ``tool_call_started``.

    Run at RELAXED first; a step with outside effects found there is rolled
    back (``_EFFECTS``) and started again at DURABLE, so its start is on disk
    before its call. Return None, an outcome, or (step row, uncertain).
    """
    with (
        sql.synchronous(DURABLE if durable else RELAXED),
        transaction.atomic(durable=True),
    ):
        cur = sql.cursor()
        lease = lease_take(cur, task_id, worker_id, reserve=1)
        if lease is None:
            lease_close_stopped(cur, task_id, worker_id)
            return None
        row = _start_next(cur, task_id, worker_id, lease) if lease.reserved else None
        if row is None:
            lease_unreserve(cur, task_id, lease)
            picked = _pick(cur, task_id, worker_id, lease)
            if isinstance(picked, StepOutcome):
                return picked
            row, uncertain = picked
        else:
            uncertain = False
        if not uncertain:
            if row.side_effects and not durable and sql.relaxable():
                transaction.set_rollback(True)
                return _EFFECTS
            crashpoint("before_started_commit")
    return row, uncertain


def _pick(
    cursor, task_id: int, worker_id: str, lease: Lease
) -> StepOutcome | tuple[StepRow, bool]:
    """Every case but the common one: finished, stopped, uncertain, waiting, exhausted.

    Return the outcome, or the step to go on with and whether it is uncertain.
    """
    found = sql.fetch_one(cursor, sql.STEP_NEXT, [task_id, *sql.FINISHED])
    row = step_row(task_id, found) if found else None
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


def _start_next(cursor, task_id: int, worker_id: str, lease: Lease) -> StepRow | None:
    """The common case in one statement: pick the next step, if it is pending,
    due and has attempts left, count the attempt and mark it running; then log
    ``tool_call_started`` under the seq the lease renewal reserved.
    None (nothing written) for every other case.
    """
    moment = timezone.now()
    now = _dt(moment)
    found = sql.fetch_one(
        cursor,
        sql.STEP_START_NEXT,
        [S.RUNNING, now, task_id, *sql.FINISHED, S.PENDING, now, task_id],
    )
    if found is None:
        return None
    row = step_row(task_id, found)
    sql.events_insert(
        task_id=task_id,
        first_seq=lease.last_seq,
        entries=[_started_entry(row, worker_id)],
        created_at=moment,
    )
    lease.reserved = 0
    return row


def _waiting(cursor, row: StepRow, worker_id: str, lease: Lease) -> StepOutcome:
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


def _start(cursor, row: StepRow, worker_id: str, pre: list, *, by: str = "") -> None:
    """Count the attempt and log ``tool_call_started`` (caller commits it)."""
    cursor.execute(sql.STEP_START, [S.RUNNING, _dt(timezone.now()), row.id])
    row.attempts += 1
    row.status = Step.Status.RUNNING
    lease_append(
        cursor,
        row.task_id,
        worker_id,
        [*pre, _started_entry(row, worker_id, by=by)],
    )


def _started_entry(row: StepRow, worker_id: str, *, by: str = "") -> tuple:
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
            # Who makes the output instead of the tool (``step_complete``: an agent).
            **({"by": by} if by else {}),
        },
    )


def _fail_exhausted(cursor, row: StepRow, worker_id: str, pre: list) -> StepOutcome:
    cursor.execute(sql.STEP_FAIL, [S.FAILED, _dt(timezone.now()), row.id])
    step_waiting_send(step_id=row.id, owner_id=row.owner_id, reason="failed")
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


def _call(row: StepRow, worker_id: str, *, rule: str = "") -> StepOutcome:
    """Call the tool of a step whose ``tool_call_started`` is committed; persist.

    A failure of the tool (it raised, or returned no usable output) is the
    tool's: the attempt fails and is retried after a back-off. A failure once
    the tool has returned (the file write, the result's commit) is the
    executor's: ``_output_unsaved`` decides it like an open envelope.
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
    return _result(row, worker_id, payload, rule=rule)


def _result(
    row: StepRow, worker_id: str, payload: dict[str, Any], *, rule: str
) -> StepOutcome:
    """Commit 2 for a payload whose file is on disk; a failure here is the executor's."""
    crashpoint("after_blob")
    try:
        outcome = _finish(
            row,
            worker_id,
            payload,
            invoked=True,
            rule=rule,
            pre=[(Event.Kind.PAYLOAD_PERSISTED, row.id, payload)],
        )
    except (DatabaseError, OSError, BlobVanished, QuotaExceeded) as exc:
        # The file is on disk and nothing names it: it goes to the
        # pending-unlink record (unlinked only if no row names the sha).
        return _output_unsaved(
            row, worker_id, exc, stage="result", rule=rule, written=payload["sha"]
        )
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


def _tool_output(row: StepRow, result: Any, root: Path) -> _Output:
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
            owner_id=row.owner_id, source_ids=list(result.source_ids)[:MAX_SOURCES]
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


def _persist_blob(row: StepRow, default_media: str, output: _Output) -> dict[str, Any]:
    """Write the payload file (durably) and return the ``payload_persisted`` data."""
    crashpoint("after_tool")
    result = output.result
    store = default_store()
    admit = quota_admit(row.owner_id)  # refused: nothing stored, output unsaved
    if output.path is not None:
        with output.path.open("rb") as fh:
            put = store.put_file(fh, admit=admit)
    else:
        put = store.put_bytes(output.data, admit=admit)
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
        payload["source_ids"] = [int(x) for x in result.source_ids]
    return payload


def _output_unsaved(
    row: StepRow,
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

    A file written whose result never committed (``written``) is named by
    nothing, and resume never adopts it: it goes to the pending-unlink record
    with the note (or with a later one, if the database refuses this one).
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
        with transaction.atomic(durable=True):
            unnamed_blobs_record()
            lease_append(
                sql.cursor(),
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
    row: StepRow, worker_id: str, error: str, rule: str, *, fault: str = ""
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
    with transaction.atomic(durable=True):
        cursor = sql.cursor()
        cursor.execute(
            sql.STEP_ATTEMPT_FAILED,
            [
                S.FAILED if exhausted else S.PENDING,
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
            step_waiting_send(step_id=row.id, owner_id=row.owner_id, reason="failed")
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
    row: StepRow,
    worker_id: str,
    payload: dict[str, Any],
    *,
    invoked: bool,
    rule: str = "",
    pre: list | None = None,
    preview: bool = True,
    joined: bool = False,
) -> StepOutcome:
    """Commit 2: the artifact, its link, the step done, the plan's advance and
    the events (``pre`` then ``tool_result_persisted``), in one transaction.

    Durable (``synchronous=FULL``) before the result is shown. ``joined``
    runs it inside the caller's transaction (an operator's adopt). A widget's
    preview is rendered after that commit (``preview``), or by a caller once
    its own transaction commits.
    """
    if joined:
        with transaction.atomic(savepoint=False):
            artifact_id, task_status = _result_write(row, worker_id, payload, pre)
    else:
        with sql.synchronous(DURABLE), transaction.atomic(durable=True):
            artifact_id, task_status = _result_write(row, worker_id, payload, pre)
    outcome = StepOutcome(
        task_id=row.task_id,
        task_status=task_status,
        step_id=row.id,
        position=row.position,
        status=S.DONE,
        invoked=invoked,
        rule=rule,
        # The keys of tasks.documents.artifact_ref, from the values in hand.
        artifact={
            "id": artifact_id,
            "sha256": payload["sha"],
            "artifact_class": row.artifact_class,
            "media_type": payload.get("media_type"),
            "size": payload["size"],
            "title": payload.get("title", ""),
        },
    )
    if preview:
        outcome_preview(outcome)
    return outcome


def _result_write(
    row: StepRow, worker_id: str, payload: dict[str, Any], pre: list | None
) -> tuple[int, str]:
    """The statements of commit 2; return (artifact id, the task's status)."""
    artifact_id = _artifact_record(row, payload)
    cursor = sql.cursor()
    now = _dt(timezone.now())
    cursor.execute(
        sql.LINK_PERSISTED, [artifact_id, row.task_id, row.id, LinkRole.PERSISTED, now]
    )
    cursor.execute(sql.STEP_DONE, [S.DONE, artifact_id, now, row.id])
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
        step_done=True,
        # The next step's start renews it; a worker that moves on leaves it
        # to run out from there, not a full lease later.
        renew=False,
    )
    if done < total:
        return artifact_id, Task.Status.RUNNING
    return artifact_id, lease_close(
        cursor, row.task_id, worker_id, Task.Status.DONE, []
    )


def _artifact_record(row: StepRow, payload: dict[str, Any]) -> int:
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
    ).id


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


def _resolve_uncertain(row: StepRow, worker_id: str) -> StepOutcome:
    """Resolve an open envelope by the step's class (docs/design.md, "Four
    artifact classes, four resume rules")."""
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
        with (
            sql.synchronous(DURABLE if row.side_effects else RELAXED),
            transaction.atomic(durable=True),
        ):
            cursor = sql.cursor()
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


def _review(row: StepRow, worker_id: str, advice, env: Envelope) -> StepOutcome:
    """Hand an open envelope to a person: the step and the task need review."""
    with transaction.atomic(durable=True):
        status = step_needs_review(
            sql.cursor(), row, worker_id, advice, note=_note(advice, env, worker_id)
        )
    return StepOutcome(
        task_id=row.task_id,
        task_status=status,
        step_id=row.id,
        position=row.position,
        status=S.NEEDS_REVIEW,
        rule=advice.rule,
        error=advice.words,
    )


def step_needs_review(
    cursor, row: StepRow, worker_id: str, advice, *, note: dict[str, Any]
) -> str:
    """The one place the executor makes a step wait for a person.

    In the caller's transaction: the step becomes ``needs_review`` with the
    rule's words, ``uncertain_resolved`` and ``step_needs_review`` are
    logged, and the lease is released with the task needing review. Anything
    that must happen exactly when a step starts waiting (telling its owner)
    belongs here, in the same transaction.
    """
    cursor.execute(sql.STEP_NEEDS_REVIEW, [S.NEEDS_REVIEW, advice.words, row.id])
    step_waiting_send(step_id=row.id, owner_id=row.owner_id, reason="needs_review")
    entries = [
        (Event.Kind.UNCERTAIN_RESOLVED, row.id, note),
        (
            Event.Kind.STEP_NEEDS_REVIEW,
            row.id,
            {"reason": advice.words, "rule": advice.rule},
        ),
    ]
    return lease_close(
        cursor, row.task_id, worker_id, Task.Status.NEEDS_REVIEW, entries
    )


def _ensure_blob(artifact_class: int, payload: dict[str, Any]) -> None:
    """A class-1 file that is intact but whose blob copy is gone (or is not
    what its sha says): copy it again. ``settle``, not ``exists``: the row
    about to name the blob was not written with it."""
    store = default_store()
    if store.settle(payload["sha"]):
        return
    if artifact_class == ArtifactClass.FILE:
        path = class1_file(payload)
        if path is not None:
            with path.open("rb") as fh:
                store.put_file(fh)


# -- a step an agent did itself ---------------------------------------------------

ERR_STEP_GONE = "step {id} is not a step of task {task}"
ERR_STEP_FINISHED = (
    "step {position} is {status}: its output stands; retry or branch the task to"
    " change it"
)
ERR_STEP_WAITING = (
    "step {position} is {status}: it waits for a person's decision before anything"
    " else is recorded for it"
)
ERR_STEP_IN_FLIGHT = (
    "step {position} is being recorded by another call under this lease; wait"
    " for its answer"
)
ERR_STEP_UNSETTLED = (
    "step {position} was left running by a worker that stopped: {words};"
    " run_next_step settles it by its class first"
)
# ``StepOutcome.rule`` of a done step whose output already has the bytes sent.
ALREADY_DONE = "already_done"


class StepRefused(Conflict):
    """``step_complete`` cannot record this step now (409): see the message."""


def step_complete(
    *,
    task_id: int,
    step_id: int,
    worker_id: str,
    data: bytes,
    media_type: str,
    title: str = "",
    source_ids=(),
) -> StepOutcome | None:
    """Record output an agent made itself as a step's result, like a tool's.

    The same envelope and commits as a tool call (``step``); only the call is
    the agent's, made before it asked. None when the lease is not ours to
    take (another worker's, or the task is not queued or running).

    1. Take the lease and read the named step in one transaction. A done
       step whose output has these very bytes is answered as it stands,
       leaving no trace (a call sent twice: ``ALREADY_DONE``); any other
       finished step, one that waits for a person, or one whose call is in
       flight under this same lease is refused (``StepRefused``). A step a
       stopped worker left running (an open envelope) is decided by its
       class first (``uncertain_decide``), as ``step`` would: where the
       class says "call again" the agent's output stands in for that call;
       where it says "needs review" the step goes to a person (the outcome
       says so); where a saved output is to be adopted, it stands.
    2. Count the attempt and log ``tool_call_started`` (with ``by: agent``):
       commit 1, durable first for a step with outside effects.
    3. Write the bytes as a content-addressed file.
    4. Commit 2 (``_finish``): ``payload_persisted``, the artifact, the step
       done, ``tool_result_persisted``. A crash between the commits leaves an
       open envelope that its class settles, as for a tool.
    """
    started = time.perf_counter()
    found = Step.objects.filter(pk=step_id, task_id=task_id).first()
    if found is None:
        raise StepRefused(ERR_STEP_GONE.format(id=step_id, task=task_id))
    owner_id = (
        Conversation.objects.filter(tasks__pk=task_id)
        .values_list("owner_id", flat=True)
        .get()
    )
    source_ids = sources_check(owner_id=owner_id, source_ids=list(source_ids))
    sha = hashlib.sha256(data).hexdigest()
    with (
        sql.synchronous(DURABLE if found.side_effects else RELAXED),
        transaction.atomic(durable=True),
    ):
        cur = sql.cursor()
        lease = lease_take(cur, task_id, worker_id)
        if lease is None:
            return None
        current = Step.objects.select_related("output").get(pk=step_id)
        row = step_row(
            task_id, [*(getattr(current, c) for c in sql.STEP_COLUMNS), owner_id]
        )
        pre = _complete_check(current, sha, lease, worker_id)
        if pre is None:  # done with these bytes: nothing to write, the lease as it was
            transaction.set_rollback(True)
        elif isinstance(pre, ResumeAdvice):
            # The class hands the open envelope to a person, as ``step`` would.
            if lease.entries:
                lease_append(cur, task_id, worker_id, lease.entries)
            env = envelope_read(row.id)
            task_status = step_needs_review(
                cur, row, worker_id, pre, note=_note(pre, env, worker_id)
            )
        else:
            _start(cur, row, worker_id, [*lease.entries, *pre], by="agent")
            crashpoint("before_started_commit")
    if pre is None:
        return _already(current)
    if isinstance(pre, ResumeAdvice):
        outcome = StepOutcome(
            task_id=task_id,
            task_status=task_status,
            step_id=row.id,
            position=row.position,
            status=S.NEEDS_REVIEW,
            rule=pre.rule,
            error=pre.words,
        )
        _observed(row, outcome, time.perf_counter() - started)
        return outcome
    crashpoint("after_started")
    output = _Output(
        ToolResult(
            data=data,
            media_type=media_type,
            title=title,
            meta={"by": "agent", "worker": worker_id[:200]},
            source_ids=source_ids,
        ),
        data=data,
        size=len(data),
    )
    try:
        payload = _persist_blob(row, media_type, output)
    except Exception as exc:  # noqa: BLE001 - the store's failure, as for a tool
        outcome = _output_unsaved(row, worker_id, exc, stage="blob", needed=len(data))
    else:
        # How an open envelope was settled to let this output stand, if one was.
        rule = next((note["rule"] for _, _, note in pre), "")
        outcome = _result(row, worker_id, payload, rule=rule)
    _observed(row, outcome, time.perf_counter() - started)
    return outcome


def _complete_check(
    step: Step, sha: str, lease: Lease, worker_id: str
) -> list | ResumeAdvice | None:
    """What to do with an agent's output for ``step``: the events to log
    before ``tool_call_started``; None for a done step that already has these
    bytes; the class's advice when it hands the step to a person; else refuse."""
    label = step.get_status_display()
    if step.status == S.DONE and step.output is not None and step.output.sha256 == sha:
        return None
    if step.is_finished:
        raise StepRefused(
            ERR_STEP_FINISHED.format(position=step.position, status=label)
        )
    if step.status in (S.FAILED, S.NEEDS_REVIEW):
        raise StepRefused(ERR_STEP_WAITING.format(position=step.position, status=label))
    if step.status != S.RUNNING:
        return []
    if not lease.entries:
        # The lease was this worker's, live, before this call: a call of its
        # own is in flight on the step.
        raise StepRefused(ERR_STEP_IN_FLIGHT.format(position=step.position))
    env = envelope_read(step.pk)
    if not env.open:
        return []
    advice = uncertain_decide(step, env)
    if advice.action == REVIEW:
        return advice
    if advice.action != CALL_AGAIN:
        # Adopt: the saved output of the call stands (run_next_step takes it).
        raise StepRefused(
            ERR_STEP_UNSETTLED.format(position=step.position, words=advice.words)
        )
    return [(Event.Kind.UNCERTAIN_RESOLVED, step.pk, _note(advice, env, worker_id))]


def _already(step: Step) -> StepOutcome:
    """The outcome of a done step, told again (``step_complete`` sent twice)."""
    task_status = Task.objects.filter(pk=step.task_id).values_list("status", flat=True)
    return StepOutcome(
        task_id=step.task_id,
        task_status=task_status.get(),
        step_id=step.pk,
        position=step.position,
        status=S.DONE,
        rule=ALREADY_DONE,
        artifact={
            "id": step.output.pk,
            "sha256": step.output.sha256,
            "artifact_class": step.output.artifact_class,
            "media_type": step.output.media_type,
            "size": step.output.size,
            "title": step.output.title,
        },
    )


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
            joined=True,
        )


def _row_of(step: Step) -> StepRow:
    owner_id = (
        Conversation.objects.filter(tasks__pk=step.task_id)
        .values_list("owner_id", flat=True)
        .get()
    )
    return step_row(
        step.task_id,
        [*(getattr(step, name) for name in sql.STEP_COLUMNS), owner_id],
    )
