"""A step's output made outside the executor's tool call, recorded through
the executor's own envelope and commits.

``step_complete`` records bytes an agent made itself as a step's result, like
a tool's (the MCP server's and the API's "complete step"); ``step_adopt``
records the payload an open envelope persisted, an operator's "adopt".
``tasks.executor`` has the envelope and the commits both run.
"""

from __future__ import annotations

import hashlib
import time

from django.db import transaction

from artifacts.services import sources_check
from pippa_site.errors import Conflict
from tasks import statements as sql
from tasks.crashpoints import crashpoint
from tasks.executor import (
    DURABLE,
    RELAXED,
    StepOutcome,
    blob_ensure,
    outcome_observed,
    output_unsaved,
    resolved_note,
    result_commit,
    result_record,
    step_needs_review,
    step_row,
    step_start,
)
from tasks.lease import Lease, lease_append, lease_lent, lease_take
from tasks.models import Conversation, Event, Step, Task
from tasks.payload import Output, payload_write
from tasks.resume import (
    CALL_AGAIN,
    REVIEW,
    ResumeAdvice,
    envelope_read,
    uncertain_decide,
)
from tasks.statements import StepRow
from tasks.tools import ToolResult

S = Step.Status

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
    4. Commit 2 (``result_commit``): ``payload_persisted``, the artifact, the step
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
                cur, row, worker_id, pre, note=resolved_note(pre, env, worker_id)
            )
        else:
            step_start(cur, row, worker_id, [*lease.entries, *pre], by="agent")
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
        outcome_observed(row, outcome, time.perf_counter() - started)
        return outcome
    crashpoint("after_started")
    output = Output(
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
        payload = payload_write(row, media_type, output)
    except Exception as exc:  # noqa: BLE001 - the store's failure, as for a tool
        outcome = output_unsaved(row, worker_id, exc, stage="blob", needed=len(data))
    else:
        # How an open envelope was settled to let this output stand, if one was.
        rule = next((note["rule"] for _, _, note in pre), "")
        outcome = result_record(row, worker_id, payload, rule=rule)
    outcome_observed(row, outcome, time.perf_counter() - started)
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
    return [
        (Event.Kind.UNCERTAIN_RESOLVED, step.pk, resolved_note(advice, env, worker_id))
    ]


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
    blob_ensure(row.artifact_class, payload)
    with lease_lent(task_id=step.task_id, holder=holder):
        Step.objects.filter(pk=step.pk).update(status=Step.Status.RUNNING)
        return result_commit(
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
