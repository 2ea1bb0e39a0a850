"""What a person (or a brain's runner) does to a task: pause, cancel, resume, retry, branch, resolve.

Every door calls these: the dashboard, the admin, the JSON API, the MCP
server and the brain runner. Each one locks the task, refuses what the task's
state does not allow (``ActionError``, or ``LeaseConflict`` while a worker
holds a live lease), writes, and logs an event naming the ``actor``.
Releasing a lease by hand is ``tasks.lease.lease_release``. The step itself
runs in ``tasks.executor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from pippa_site.errors import Conflict, Invalid, LeaseConflict
from pippa_site.text import TITLE_MAX, media_type_check, text_check, title_clean
from tasks.agent_step import ALREADY_DONE, step_adopt
from tasks.agent_step import step_complete as executor_step_complete
from tasks.executor import outcome_preview, step
from tasks.lease import lease_drop, lease_refuse_live, lease_release_own
from tasks.models import TASK_OPEN, Event, LinkRole, Step, Task, TaskArtifact
from tasks.resume import (
    ResumeAdvice,
    envelope_read,
    resume_advice,
    uncertain_facts,
)
from tasks.rules import ADOPT, CALL_AGAIN, RULES, uncertain_rule
from tasks.services import events_append
from tasks.words import CHOICES, OUTSIDE_RERUN, OUTSIDE_RETRY

ERR_NOT_RETRYABLE = (
    "only a failed or needs-review step can be retried (step {position} is {status})"
)
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
ERR_TASK_NOT_RUNNABLE = (
    "the task is {status}; only a queued or running task can be paused"
)
ERR_TASK_CANCELLED = (
    "the task was cancelled; branch it to continue from an earlier step"
)
ERR_NOT_CANCELLABLE = "the task is {status}; only an unfinished task can be cancelled"
ERR_BRANCH_NOTHING = (
    "a branch after the last step would be a copy that changes nothing:"
    " branch from an earlier step"
)

# What a runner is told when no step ran (step_run).
ERR_NOTHING_TO_RUN = "nothing to run: the task is {status}"
# The API's wording; the MCP door names its own tool (StepRun.waiting).
ERR_PAUSED = "the task is paused; resume it first (POST /api/v1/tasks/{id}/resume)"
ERR_ALL_DONE = "every step is finished: the task is {status}"
ERR_BLOCKED = "step {position} is {status}: a person must retry or resolve it"
ERR_NO_DECISION = "step {position} is {status}: it waits for no decision"
ERR_NOT_A_CHOICE = "{action!r} is not a way forward for step {position} now; the choices are: {allowed}"
ERR_CONFIRM = (
    "“{title}” acts outside Pippa ({tool}): {label} may reach the outside world a"
    " second time. {warning} Confirm to go ahead."
)
ERR_LEASE_BUSY = (
    "another worker ({owner}) holds the task's lease until {until}; try again later"
)
ERR_LEASE_CHANGING = "the task's lease changed hands a moment ago; try again"

ACTIONS = ("adopt", "rerun", "fail", "skip")


class ActionError(Conflict):
    """The task's state does not allow the action now (409 at the API)."""


def _locked(task: Task) -> Task:
    return Task.objects.select_for_update().get(pk=task.pk)


def _release_dead(locked: Task, actor: str) -> list:
    """Clear a lease nobody holds live before an action; the entry for its log."""
    return lease_drop(locked, actor=actor, forced=True)


def _refuse_cancelled(task: Task) -> None:
    if task.status == Task.Status.CANCELLED:
        raise ActionError(ERR_TASK_CANCELLED)


def _settle(
    task: Task, entries: list, *, actor: str = "", resume: bool = False
) -> Task:
    """Recompute a task's status and progress from its steps after a manual action.

    ``resume``: the action was a person's decision, which is also the go-ahead,
    so a paused task goes back to the worker queue instead of staying paused.
    """
    statuses = list(Step.objects.filter(task=task).values_list("status", flat=True))
    done = sum(1 for s in statuses if s in Step.Status.finished())
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


def _write(task: Task, entries: list, **changes) -> Task:
    """Write an action's changes to the (locked) task and its events; refresh ``task``."""
    changes.setdefault("updated_at", timezone.now())
    Task.objects.filter(pk=task.pk).update(**changes)
    events_append(task_id=task.pk, entries=entries)
    task.refresh_from_db()
    return task


# -- pause, cancel and resume ----------------------------------------------------


@transaction.atomic
def task_pause(*, task: Task, actor: str = "") -> Task:
    """Take a queued or running task off the worker queue until it is resumed."""
    locked = _locked(task)
    if locked.status not in (Task.Status.QUEUED, Task.Status.RUNNING):
        raise ActionError(ERR_TASK_NOT_RUNNABLE.format(status=locked.status))
    entries: list = [(Event.Kind.TASK_PAUSED, None, {"actor": actor})]
    if locked.lease_expired:
        entries += _release_dead(locked, actor)
    return _write(task, entries, status=Task.Status.PAUSED)


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
        raise ActionError(
            ERR_NOT_CANCELLABLE.format(status=locked.get_status_display())
        )
    in_flight = locked.lease_live
    entries: list = [
        (
            Event.Kind.TASK_CANCELLED,
            None,
            {"actor": actor, "previous_status": locked.status, "in_flight": in_flight},
        )
    ]
    if not in_flight:
        entries += _release_dead(locked, actor)
    now = timezone.now()
    return _write(
        task, entries, status=Task.Status.CANCELLED, updated_at=now, finished_at=now
    )


@transaction.atomic
def task_resume(*, task: Task, actor: str = "") -> Task:
    """Queue a paused or interrupted task for a worker; log who asked."""
    locked = _locked(task)
    if locked.status == Task.Status.DONE:
        raise ActionError(ERR_TASK_DONE)
    _refuse_cancelled(locked)
    blocked = (
        Step.objects.filter(
            task=locked, status__in=[Step.Status.FAILED, Step.Status.NEEDS_REVIEW]
        )
        .order_by("position")
        .first()
    )
    if blocked is not None:
        raise ActionError(
            ERR_RESUME_BLOCKED.format(
                position=blocked.position, status=blocked.get_status_display()
            )
        )
    entries: list = []
    if locked.lease_expired:
        entries += _release_dead(locked, actor)
    # A worker still holding a live lease (paused mid-step) simply carries on:
    # its next renewal accepts a queued task.
    entries.append((Event.Kind.TASK_QUEUED, None, {"actor": actor, "reason": "resume"}))
    return _write(task, entries, status=Task.Status.QUEUED, finished_at=None)


# -- retry -------------------------------------------------------------------------


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
        raise ActionError(
            ERR_NOT_RETRYABLE.format(
                position=current.position, status=current.get_status_display()
            )
        )
    lease_refuse_live(task, actor)
    entries: list = _release_dead(task, actor)
    Step.objects.filter(pk=current.pk).update(
        status=Step.Status.PENDING,
        stopped=False,
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


# -- branch ------------------------------------------------------------------------


@transaction.atomic
def task_branch(*, task: Task, after_position: int, actor: str = "") -> Task:
    """Make a new task in the same conversation keeping steps 1..k and their outputs.

    1. Refuse a ``k`` out of range, one that keeps every step (the branch
       would have nothing to run), or one that keeps an unfinished step.
    2. Create the branch task, queued.
    3. Copy every step: kept ones with their status, attempts and output,
       the rest as new pending steps; link the kept outputs as referenced.
    4. Log ``task_branched`` on both tasks.
    """
    source = Task.objects.get(pk=task.pk)
    steps = list(Step.objects.filter(task=source).order_by("position"))
    _branch_check(steps, after_position)
    branch = _branch_task(source, steps, after_position)
    _branch_steps(branch, steps, after_position)
    entries = [
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
    if branch.status == Task.Status.QUEUED:
        entries.append((Event.Kind.TASK_QUEUED, None, {"reason": "branch"}))
    events_append(task_id=branch.pk, entries=entries)
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


def _branch_check(steps: list[Step], after_position: int) -> None:
    if not 0 <= after_position <= len(steps):
        raise ActionError(ERR_BRANCH_POSITION.format(total=len(steps)))
    if after_position == len(steps):
        raise ActionError(ERR_BRANCH_NOTHING)
    for s in steps[:after_position]:
        if not s.is_finished:
            raise ActionError(
                ERR_BRANCH_UNFINISHED.format(
                    position=s.position, status=s.get_status_display()
                )
            )


def _branch_task(source: Task, steps: list[Step], after_position: int) -> Task:
    now = timezone.now()
    status = Task.Status.DONE if after_position == len(steps) else Task.Status.QUEUED
    return Task.objects.create(
        conversation_id=source.conversation_id,
        title=f"{source.title} (branch after step {after_position})"[:300],
        brain=source.brain,
        status=status,
        steps_total=len(steps),
        steps_done=after_position,
        branched_from=source,
        branched_at=after_position,
        created_at=now,
        updated_at=now,
        finished_at=now if status == Task.Status.DONE else None,
    )


def _branch_steps(branch: Task, steps: list[Step], after_position: int) -> None:
    now = timezone.now()
    copies = []
    for s in steps:
        keep = s.position <= after_position
        copies.append(
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
    created = Step.objects.bulk_create(copies)
    TaskArtifact.objects.bulk_create(
        [
            TaskArtifact(
                artifact_id=c.output_id,
                task=branch,
                step=c,
                role=LinkRole.REFERENCED,
                created_at=now,
            )
            for c in created
            if c.output_id
        ]
    )


# -- resolve -----------------------------------------------------------------------


def step_resolve_options(step: Step) -> list[str]:
    """Return the choices the resume rules (``tasks.rules``) give a person for
    a failed, set-aside or uncertain step now."""
    step = Step.objects.select_related("task").get(pk=step.pk)
    if step.status == Step.Status.FAILED:
        return list(RULES["failed_retry"].choices)
    uncertain_running = step.status == Step.Status.RUNNING and not step.task.lease_live
    if step.status != Step.Status.NEEDS_REVIEW and not uncertain_running:
        return []
    env = envelope_read(step.pk)
    if uncertain_running and not env.open:
        return []
    facts = uncertain_facts(step, env)
    return uncertain_rule(facts).offered(facts)


def step_resolve(*, step: Step, action: str, actor: str = "") -> Step:
    """Resolve a failed or uncertain step by hand: adopt, rerun, fail or skip.

    1. Lock the task; refuse an unknown action, a cancelled task, a live
       lease, or an action the class rules do not offer for the step now.
    2. Clear a dead lease; do the action and log ``step_resolved`` with it.
    3. Settle the task's status from its steps. The decision is also the
       go-ahead: a paused task is queued for the worker (unless the decision
       leaves it failed or finished).
    4. After the commit, render an adopted widget's preview.
    """
    if action not in ACTIONS:
        raise ActionError(ERR_ACTION_UNKNOWN.format(action=action))
    with transaction.atomic():
        outcome = _resolve_locked(step=step, action=action, actor=actor)
    if outcome is not None:
        outcome_preview(outcome)
    step.refresh_from_db()
    return step


def _resolve_locked(*, step: Step, action: str, actor: str):
    task = _locked(step.task)
    _refuse_cancelled(task)
    lease_refuse_live(task, actor)
    allowed = step_resolve_options(step)
    current = Step.objects.get(pk=step.pk)
    if action not in allowed:
        raise ActionError(
            ERR_ACTION_NOT_ALLOWED.format(
                action=action,
                position=current.position,
                allowed=", ".join(allowed) or "none",
            )
        )
    entries: list = _release_dead(task, actor)
    note = (
        Event.Kind.STEP_RESOLVED,
        current.pk,
        {"action": action, "rule": f"operator_{action}", "actor": actor},
    )
    outcome = None
    if action == "adopt":
        if entries:
            events_append(task_id=task.pk, entries=entries)
            entries = []
        outcome = step_adopt(step=current, holder=actor or "operator", pre=[note])
        task.refresh_from_db()
    elif action == "rerun":
        Step.objects.filter(pk=current.pk).update(
            status=Step.Status.PENDING,
            attempts=min(current.attempts, current.max_attempts - 1),
            next_attempt_at=None,
            error="",
            stopped=False,
        )
        entries.append(note)
    else:  # fail or skip: the step ends here, with its own event
        ending = {
            "fail": (Step.Status.FAILED, Event.Kind.STEP_FAILED),
            "skip": (Step.Status.SKIPPED, Event.Kind.STEP_SKIPPED),
        }
        status, kind = ending[action]
        # A step a person stopped waits for nobody (needs_you_sql) but keeps
        # its other ways forward.
        Step.objects.filter(pk=current.pk).update(
            status=status, finished_at=timezone.now(), stopped=action == "fail"
        )
        entries += [note, (kind, current.pk, {"actor": actor})]
    _settle(task, entries, actor=actor, resume=True)
    return outcome


# -- deciding a step that waits for a person ---------------------------------------

# Resume advice that needs no decision from a person.
NO_DECISION = ("wait", "run", "none")
# A step in one of these may wait for a person (``StepStatus.attention``).
ATTENTION_STEPS = Step.Status.attention()


@dataclass
class Choice:
    """One way forward for a step that needs a person."""

    action: str  # adopt, rerun, retry, skip, fail
    label: str
    words: str
    recommended: bool = False
    confirm: bool = False  # reaches outside again: asked to confirm first
    warning: str = ""


@dataclass
class Decision:
    """A step that waits for a person: what resume would do, and the choices."""

    step: Step
    advice: ResumeAdvice
    options: list[str]  # what step_resolve allows (step_resolve_options)
    choices: list[Choice]

    @property
    def plain_words(self) -> str:
        return self.advice.plain_words


def step_decision(*, step: Step, task: Task) -> Decision | None:
    """Return the decision ``step`` waits for, or None when it waits for none.

    The one source of the decision card's choices: the dashboard draws them
    and the MCP door offers them, in the words of ``tasks.words``.
    A cancelled task waits for no decision.
    """
    if task.status == Task.Status.CANCELLED or step.status not in ATTENTION_STEPS:
        return None
    advice = resume_advice(step, task=task)
    if advice.action in NO_DECISION:
        return None
    options = list(step_resolve_options(step))
    return Decision(
        step=step,
        advice=advice,
        options=options,
        choices=step_choices(step=step, advice=advice, options=options),
    )


def step_choices(
    *, step: Step, advice: ResumeAdvice, options: list[str]
) -> list[Choice]:
    """The ways forward for a step that needs a person, the one Pippa would take first."""
    wanted = {ADOPT: "adopt", CALL_AGAIN: "rerun"}.get(advice.action)
    chosen = list(options)
    if step.status in (Step.Status.FAILED, Step.Status.NEEDS_REVIEW):
        # Starting over is a retry (a new request); for a plain failure it
        # replaces "run the same call again", which would say the same.
        if "rerun" in chosen and not step.side_effects:
            chosen.remove("rerun")
        chosen.insert(
            chosen.index("fail") if "fail" in chosen else len(chosen), "retry"
        )
    choices = []
    for action in chosen:
        label, words = CHOICES[action]
        choice = Choice(action=action, label=label, words=words)
        if action == wanted:
            choice.recommended = True
        if step.side_effects and action in ("rerun", "retry"):
            choice.confirm = True
            choice.warning = OUTSIDE_RERUN if action == "rerun" else OUTSIDE_RETRY
        choices.append(choice)
    choices.sort(key=lambda c: not c.recommended)
    return choices


def step_decide(
    *, step: Step, action: str, confirmed: bool = False, actor: str = ""
) -> Step:
    """Take one of the decision card's choices for a step that waits for a person.

    1. Refuse a step that waits for no decision, and an action the card does
       not offer now (``step_decision``).
    2. A choice that reaches outside Pippa again (``confirm``) needs
       ``confirmed``, as the dashboard's confirmation page does.
    3. ``retry`` is ``step_retry``; every other choice is ``step_resolve``.
    """
    step = Step.objects.select_related("task").get(pk=step.pk)
    decision = step_decision(step=step, task=step.task)
    if decision is None:
        raise ActionError(
            ERR_NO_DECISION.format(
                position=step.position, status=step.get_status_display()
            )
        )
    choice = next((c for c in decision.choices if c.action == action), None)
    if choice is None:
        raise ActionError(
            ERR_NOT_A_CHOICE.format(
                action=action,
                position=step.position,
                allowed=", ".join(c.action for c in decision.choices),
            )
        )
    if choice.confirm and not confirmed:
        raise ConfirmationNeeded(
            ERR_CONFIRM.format(
                title=step.title,
                tool=step.tool,
                label=f"“{choice.label}”",
                warning=choice.warning,
            )
        )
    if action == "retry":
        return step_retry(step=step, actor=actor)
    return step_resolve(step=step, action=action, actor=actor)


class ConfirmationNeeded(ActionError):
    """A choice that reaches outside Pippa again, asked without confirmation."""


# -- a runner's step -----------------------------------------------------------------


@dataclass(frozen=True)
class StepRun:
    ran: bool
    detail: str
    step: object | None
    lease_busy: bool = False
    invoked: bool = False
    rule: str = ""
    # Why nothing ran, for a door to word its own way forward: "paused", or
    # "decision" (a step waits for a person).
    waiting: str = ""


def _step_waiting(task) -> Step | None:
    """The first step of a failed or needs-review task that waits for a decision."""
    if task.status not in (Task.Status.FAILED, Task.Status.NEEDS_REVIEW):
        return None
    return (
        Step.objects.select_related("output")
        .filter(task=task, status__in=(Step.Status.FAILED, Step.Status.NEEDS_REVIEW))
        .order_by("position")
        .first()
    )


def step_run(*, task, worker_id: str) -> StepRun:
    """Ask the executor for one step; return once its result is persisted.

    ``tasks.executor.step`` does the work (commit 1: the lease and
    ``tool_call_started``; the call; the payload file; commit 2: the result).
    This only explains its answer: a step ran (or an uncertain one was
    resolved), the task is settled or paused, or another worker holds the
    lease (``lease_busy``, the caller may wait and ask again). A lease the
    executor found live and that ran out before this read the task back is
    not an answer: the executor is asked once more, so a runner waiting out a
    dead worker's lease is never told "nothing to run" for a task that can.
    """
    outcome = step(task_id=task.pk, worker_id=worker_id)
    task.refresh_from_db()
    if outcome is None and not task.is_idle and not task.lease_held_by_other(worker_id):
        # The executor found another worker's lease live, and it ran out
        # before we read the task back: the step is ours to take now.
        outcome = step(task_id=task.pk, worker_id=worker_id)
        task.refresh_from_db()
    if outcome is None:
        if task.status == Task.Status.PAUSED:
            return StepRun(
                ran=False,
                detail=ERR_PAUSED.format(id=task.pk),
                step=None,
                waiting="paused",
            )
        if not task.is_idle:
            # Another worker holds the lease, or held it when the executor
            # looked: either way the caller may wait and ask again.
            if task.lease_held_by_other(worker_id):
                detail = ERR_LEASE_BUSY.format(
                    owner=task.lease_owner, until=task.lease_expires_at.isoformat()
                )
            else:
                detail = ERR_LEASE_CHANGING
            return StepRun(ran=False, detail=detail, step=None, lease_busy=True)
        waiting = _step_waiting(task)
        if waiting is not None:
            # A failed or stopped task: the step a person must decide on is
            # the answer, not "nothing to run" (the door names what decides).
            return StepRun(
                ran=False,
                detail=ERR_BLOCKED.format(
                    position=waiting.position, status=waiting.get_status_display()
                ),
                step=waiting,
                waiting="decision",
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
    waits = step_row.status in (Step.Status.FAILED, Step.Status.NEEDS_REVIEW)
    return StepRun(
        ran=ran,
        detail=detail[:2000],
        step=step_row,
        invoked=outcome.invoked,
        rule=outcome.rule,
        waiting="decision" if waits else "",
    )


# -- a step an agent did itself ----------------------------------------------------

# The most bytes an agent sends as one step's output (the API and MCP take
# text or base64 in JSON; a larger output goes up as an artifact upload).
MAX_OUTPUT_BYTES = 1024 * 1024
ERR_OUTPUT_EMPTY = "the output is empty: send what the step produced"
ERR_OUTPUT_TOO_LARGE = (
    f"the output is larger than {MAX_OUTPUT_BYTES} bytes; upload it as an artifact"
    " and complete the step with a short text that names it"
)
ERR_COMPLETE_STOPPED = (
    "the task is {status}: a step can be completed only while it is queued or"
    " running{hint}"
)
HINT_PAUSED = " (resume it first)"
HINT_DECISION = " (a step waits for a person's decision first)"
MSG_COMPLETED = "step {position} is done: its output is saved as artifact {id}"
MSG_ALREADY = (
    "step {position} was already done with these very bytes (artifact {id}):"
    " nothing new was written"
)


@dataclass(frozen=True)
class StepCompletion:
    completed: bool
    already: bool
    detail: str
    rule: str
    step: Step


def step_complete(
    *,
    task: Task,
    step_id: int,
    data: bytes,
    media_type: str,
    worker_id: str,
    title: str = "",
    source_ids=(),
) -> StepCompletion:
    """Record what an agent made for a step itself: "step 2 is done, here is its output".

    ``tasks.agent_step.step_complete`` stores it through the envelope and
    commits a tool's output takes (write before show; the step's class and
    its resume rule stand). This checks what the agent sent, explains a
    refusal (a task that is not queued or running, another worker's lease),
    and gives the lease back afterwards: an agent may never call again.
    """
    if not data:
        raise Invalid(ERR_OUTPUT_EMPTY)
    if len(data) > MAX_OUTPUT_BYTES:
        raise Invalid(ERR_OUTPUT_TOO_LARGE)
    media_type_check(media_type, field="media_type")
    text_check(title, field="title")
    try:
        outcome = executor_step_complete(
            task_id=task.pk,
            step_id=step_id,
            worker_id=worker_id,
            data=data,
            media_type=media_type,
            title=title_clean(title)[:TITLE_MAX],
            source_ids=source_ids,
        )
    finally:
        lease_release_own(task=task, worker_id=worker_id)
    task.refresh_from_db()
    if outcome is None:
        if task.lease_held_by_other(worker_id):
            raise LeaseConflict(
                ERR_LEASE_BUSY.format(
                    owner=task.lease_owner, until=task.lease_expires_at.isoformat()
                )
            )
        if task.status in (Task.Status.QUEUED, Task.Status.RUNNING):
            raise LeaseConflict(ERR_LEASE_CHANGING)
        hint = {
            Task.Status.PAUSED: HINT_PAUSED,
            Task.Status.FAILED: HINT_DECISION,
            Task.Status.NEEDS_REVIEW: HINT_DECISION,
        }.get(task.status, "")
        raise ActionError(
            ERR_COMPLETE_STOPPED.format(status=task.get_status_display(), hint=hint)
        )
    step_row = Step.objects.select_related("output").get(pk=outcome.step_id)
    already = outcome.rule == ALREADY_DONE
    if outcome.status == Step.Status.DONE:
        words = MSG_ALREADY if already else MSG_COMPLETED
        detail = words.format(position=step_row.position, id=step_row.output_id)
    else:
        detail = outcome.error or ERR_BLOCKED.format(
            position=step_row.position, status=step_row.get_status_display()
        )
    return StepCompletion(
        completed=outcome.status == Step.Status.DONE,
        already=already,
        detail=detail[:2000],
        rule="" if already else outcome.rule,
        step=step_row,
    )
