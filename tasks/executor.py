"""The step executor: one step of one task, by one worker, durable at every boundary.

``step(task_id=…, worker_id=…)``, in two commits, each a Django
``transaction.atomic(durable=True)`` running ``tasks.statements``'s named
statements in this order:

1. **Commit 1** (``_begin``): take or renew the lease (``tasks.lease.
   lease_take``: ours, free or dead; a takeover logs ``lease_taken_over``),
   reserving the seq of the event to come. Rehydrate now, and only here: the
   common case picks the next step and starts it in one ``UPDATE …
   RETURNING`` (``STEP_START_NEXT``: pending, due, attempts left) and logs
   ``tool_call_started``. Every other case (``_pick``) gives the seq back and
   reads the step: done, waiting for a person, waiting out a back-off, out of
   attempts, or still ``running``: an open envelope, the uncertain state,
   resolved by its class (``tasks.resume.uncertain_decide``), never by
   blindly calling again. A step with outside effects begins at SQLite's
   ``synchronous=FULL`` (read before the transaction: ``_start_level``), so
   its start is on disk before the call; any other may ride on the next sync
   (losing it re-runs a call whose result nobody saw). PostgreSQL's worker
   connection runs with ``synchronous_commit`` on.
2. Call the tool with the idempotency key ``pippa:<task>:<step>:<generation>``
   (only an explicit retry bumps the generation); the lease keeper renews the
   lease through the call.
3. Write the payload as a content-addressed file (``tasks.payload``): every
   output is a file, whatever its size.
4. **Commit 2** (``result_commit``), at ``synchronous=FULL``: the artifact
   row, its link, the step done, then ``payload_persisted`` and
   ``tool_result_persisted`` with the plan's advance; the task's close after
   its last step. Only then is the result returned.

A crash between 3 and 4 leaves a file no row names (the doctor sweeps it) and
an open envelope with no payload, which the class rules settle. Every event
after the lease is taken goes through ``_log``, conditional on still holding
it, so a worker that lost its lease records nothing (``LeaseLost``); the
holder gives the lease back when the task stops being runnable. Each boundary
has a crash point (``tasks.crashpoints``). ``tasks.agent_step`` records output
made outside a tool call through the same commits.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from artifacts.gc import blobs_unlink_after_commit
from artifacts.models import ArtifactClass
from artifacts.preview import WIDGET_MEDIA_TYPES
from artifacts.quota import QuotaExceeded
from artifacts.services import (
    BlobVanished,
    artifact_insert,
)
from artifacts.store import default_store
from pippa_site import metrics
from tasks import statements as sql
from tasks.crashpoints import crashpoint
from tasks.faults import REASON_DISK_FULL, fault_reason, retry_delay
from tasks.hooks import step_waiting_send
from tasks.lease import (
    Lease,
    LeaseLost,
    lease_append,
    lease_close,
    lease_keeper,
    lease_take,
)
from tasks.models import Event, LinkRole, Step, Task
from tasks.payload import payload_write, tool_output
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
from tasks.statements import STEP_COLUMNS, StepRow, parse_dt
from tasks.tools import ToolContext, files_root, tool_get

log = logging.getLogger("pippa.executor")

ERR_UNSAVED = "the tool ran; its output could not be saved: {reason}"
ERR_WAITING = "waiting before attempt {attempt}: next attempt {when}"

S = Step.Status
T = Task.Status
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


def step_row(task_id: int, values) -> StepRow:
    """The step row from ``STEP_COLUMNS`` then the owner id, as a statement
    returns them or a model instance supplies them."""
    *columns, owner_id = values
    fields = dict(zip(STEP_COLUMNS, columns, strict=True))
    args = fields["args"]
    if isinstance(args, (str, bytes, bytearray)):
        args = json.loads(args)
    return StepRow(
        **fields
        | {
            "args": args or {},
            "side_effects": bool(fields["side_effects"]),
            "next_attempt_at": parse_dt(fields["next_attempt_at"]),
        },
        task_id=task_id,
        owner_id=owner_id,
    )


# -- the step -----------------------------------------------------------------


def step(*, task_id: int, worker_id: str) -> StepOutcome | None:
    """Run one step of one task; None when the lease is held elsewhere or the task is idle.

    See the module docstring for the numbered state machine. The common case
    (our lease, the next step pending and due) is three statements before the
    call, in commit 1: the renewal reserving the event's seq, one
    ``UPDATE … RETURNING`` that picks and starts the step, and the event.
    """
    started = time.perf_counter()
    picked = _begin(task_id, worker_id, _start_level(task_id))
    if picked is _EFFECTS:
        # The plan changed between the look and the start: begin again, durably.
        picked = _begin(task_id, worker_id, DURABLE)
    if picked is None or isinstance(picked, StepOutcome):
        return picked
    row, uncertain = picked
    if uncertain:
        outcome = _resolve_uncertain(row, worker_id)
    else:
        outcome = _call(row, worker_id)
    outcome_observed(row, outcome, time.perf_counter() - started)
    return outcome


def outcome_observed(row: StepRow, outcome: StepOutcome, seconds: float) -> None:
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


def _start_level(task_id: int) -> str:
    """SQLite's sync level for commit 1: DURABLE when the step it would start
    has outside effects, else RELAXED; "" where the level is not the
    executor's to set (PostgreSQL, or inside an outer transaction).

    Read before the transaction: SQLite sets a transaction's level before it
    begins, never inside it.
    """
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return ""
    with connection.cursor() as cursor:
        cursor.execute(sql.STEP_NEXT_EFFECTS, [task_id, *sql.FINISHED])
        found = cursor.fetchone()
    return DURABLE if found and found[0] else RELAXED


_EFFECTS = object()  # _begin's answer: start this step again at DURABLE


def _begin(task_id: int, worker_id: str, level: str):
    """Commit 1: take the lease, pick the step, log ``tool_call_started``.

    At ``level`` (``_start_level``). A step with outside effects found
    started at RELAXED (the plan changed since the look) is rolled back
    (``_EFFECTS``), to be started again at DURABLE: its start is on disk
    before its call. Return None, an outcome, or (step row, uncertain).
    """
    with (
        sql.synchronous(level or RELAXED),
        transaction.atomic(durable=True),
    ):
        cursor = sql.cursor()
        lease = lease_take(cursor, task_id, worker_id, reserve=1)
        if lease is None:
            return None
        row = _start_next(cursor, task_id, worker_id, lease) if lease.reserved else None
        if row is None:
            if lease.reserved:
                cursor.execute(sql.SEQS_GIVE_BACK, [lease.reserved, task_id])
            picked = _pick(cursor, task_id, worker_id, lease)
            if isinstance(picked, StepOutcome):
                return picked
            row, uncertain = picked
        else:
            uncertain = False
        if not uncertain:
            if row.side_effects and level == RELAXED:
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
    cursor.execute(sql.STEP_NEXT, [task_id, *sql.FINISHED])
    found = cursor.fetchone()
    if found is None:
        _log(cursor, task_id, worker_id, lease.entries, close=Task.Status.DONE)
        return StepOutcome(task_id=task_id, task_status=Task.Status.DONE)
    row = step_row(task_id, found)
    if row.status in (Step.Status.NEEDS_REVIEW, Step.Status.FAILED):
        task_status = T.FAILED if row.status == S.FAILED else T.NEEDS_REVIEW
        _log(cursor, task_id, worker_id, lease.entries, close=task_status)
        return StepOutcome(
            task_id=task_id,
            task_status=task_status,
            step_id=row.id,
            position=row.position,
            status=row.status,
        )
    if row.status == Step.Status.RUNNING:
        if lease.entries:
            _log(cursor, task_id, worker_id, lease.entries)
        return row, True
    if row.next_attempt_at and row.next_attempt_at > timezone.now():
        return _waiting(cursor, row, worker_id, lease)
    if row.attempts >= row.max_attempts:
        return _fail_exhausted(cursor, row, worker_id, lease.entries)
    step_start(cursor, row, worker_id, lease.entries)
    return row, False


def _start_next(cursor, task_id: int, worker_id: str, lease: Lease) -> StepRow | None:
    """The common case in one statement: pick the next step, if it is pending,
    due and has attempts left, count the attempt and mark it running; then log
    ``tool_call_started`` under the seq the lease renewal reserved.
    None (nothing written) for every other case.
    """
    moment = timezone.now()
    now = _dt(moment)
    cursor.execute(
        sql.STEP_START_NEXT,
        [S.RUNNING, now, task_id, *sql.FINISHED, S.PENDING, now, task_id],
    )
    found = cursor.fetchone()
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
    task_status = T.QUEUED
    if lease.entries:
        # The lease was only just taken for this look: leave no trace of it.
        transaction.set_rollback(True)
    else:
        _log(cursor, row.task_id, worker_id, [], close=task_status, reason="waiting")
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


def step_start(
    cursor, row: StepRow, worker_id: str, pre: list, *, by: str = ""
) -> None:
    """Count the attempt and log ``tool_call_started`` (caller commits it)."""
    cursor.execute(sql.STEP_START, [S.RUNNING, _dt(timezone.now()), row.id])
    row.attempts += 1
    row.status = Step.Status.RUNNING
    _log(cursor, row.task_id, worker_id, [*pre, _started_entry(row, worker_id, by=by)])


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


def _log(
    cursor,
    task_id: int,
    worker_id: str,
    entries: list,
    *,
    close: str = "",
    reason: str = "",
    step_done: bool = False,
) -> tuple:
    """Write the step's events under the lease this worker holds: every
    write of the executor after the lease is taken ends here, and raises
    ``LeaseLost`` when another worker holds the lease now.

    Without ``close``, ``tasks.lease.lease_append`` (``step_done`` is its:
    the result's commit). With ``close``, the task's next status, the
    lease is given back with it (``tasks.lease.lease_close``). Return
    (last_seq, steps_done, steps_total).
    """
    if close:
        return lease_close(cursor, task_id, worker_id, close, entries, reason=reason)
    return lease_append(cursor, task_id, worker_id, entries, step_done=step_done)


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
    _log(cursor, row.task_id, worker_id, entries, close=Task.Status.FAILED)
    return StepOutcome(
        task_id=row.task_id,
        task_status=Task.Status.FAILED,
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
    executor's: ``output_unsaved`` decides it like an open envelope.
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
            output = tool_output(row, tool.fn(ctx, **row.args), root)
        except Exception as exc:  # noqa: BLE001 - any tool error fails the attempt
            failure = exc
        else:
            needed = output.size
            try:
                payload = payload_write(row, tool.media_type, output)
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
        return output_unsaved(
            row, worker_id, unsaved, stage="blob", needed=needed, rule=rule
        )
    return result_record(row, worker_id, payload, rule=rule)


def result_record(
    row: StepRow, worker_id: str, payload: dict[str, Any], *, rule: str
) -> StepOutcome:
    """Commit 2 for a payload whose file is on disk; a failure here is the executor's."""
    crashpoint("after_blob")
    try:
        outcome = result_commit(
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
        return output_unsaved(
            row, worker_id, exc, stage="result", rule=rule, written=payload["sha"]
        )
    crashpoint("after_result")
    return outcome


def output_unsaved(
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
            _log(
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
        env, advice = _decide(row)
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
        # Failed for good; queued until its back-off ends; or run again now.
        close = T.FAILED if exhausted else T.QUEUED if next_at else ""
        reason = "waiting to retry" if close == T.QUEUED else ""
        _log(cursor, row.task_id, worker_id, entries, close=close, reason=reason)
        task_status = close or T.RUNNING
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


def result_commit(
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
    # The lease is checked, not renewed: the next step's start renews it, and
    # a worker that moves on leaves it to run out from there.
    _, done, total = _log(cursor, row.task_id, worker_id, entries, step_done=True)
    if done < total:
        return artifact_id, Task.Status.RUNNING
    _log(cursor, row.task_id, worker_id, [], close=T.DONE)
    return artifact_id, T.DONE


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
    env, advice = _decide(row)
    note = resolved_note(advice, env, worker_id)
    if advice.action == ADOPT:
        payload = dict(env.payload)
        pre = [(Event.Kind.UNCERTAIN_RESOLVED, row.id, note)]
        try:
            blob_ensure(row.artifact_class, payload)
            outcome = result_commit(
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
            step_start(cursor, row, worker_id, pre)
            crashpoint("before_started_commit")
        return _call(row, worker_id, rule=advice.rule)
    return _review(row, worker_id, advice, env)


def blob_ensure(artifact_class: int, payload: dict[str, Any]) -> None:
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


def _decide(row: StepRow) -> tuple[Envelope, ResumeAdvice]:
    """The step's open envelope and what its class says to do with it."""
    env = envelope_read(row.id)
    step = Step(**{c: getattr(row, c) for c in STEP_COLUMNS}, task_id=row.task_id)
    return env, uncertain_decide(step, env)


def resolved_note(advice, env: Envelope, worker_id: str) -> dict[str, Any]:
    """The ``uncertain_resolved`` event's data: how an open envelope was settled."""
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
            sql.cursor(),
            row,
            worker_id,
            advice,
            note=resolved_note(advice, env, worker_id),
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
    _log(cursor, row.task_id, worker_id, entries, close=T.NEEDS_REVIEW)
    return T.NEEDS_REVIEW
