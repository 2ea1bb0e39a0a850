"""MCP tools that run, record, stop and decide a task's steps."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from django.db import DatabaseError
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import (
    ToolError,
)
from pydantic import Field

from artifacts.services import MAX_SOURCES
from pippa_mcp.answers import (
    content_bytes,
    cursor_after,
    cursor_read,
    excerpt_of,
    page_message,
    plain_json,
    step_get,
    task_brief,
    uri_of,
)
from pippa_mcp.arguments import (
    MAX_STORE_BYTES,
    PAGE_ROWS,
    Cursor,
    DecisionAction,
    Flag,
    Id,
    Limit,
    Worker,
)
from pippa_mcp.door import actor, current_user, in_thread, tool
from pippa_mcp.shapes import (
    Choice,
    CompletedStep,
    DecideAnswer,
    DecisionOut,
    DecisionPage,
    StepRunAnswer,
    StepState,
    TaskActionAnswer,
)
from pippa_site.slots import STEP_RUNS
from tasks import actions
from tasks.documents import (
    artifacts_get,
    step_complete_payload,
    step_payload,
    task_get_for_user,
)
from tasks.lease import door_worker_id, lease_release_own
from tasks.models import Step, Task
from tasks.shapes import (
    MediaType,
    TitleOrEmpty,
)
from tasks.words import CHOICES

# Seconds between "still running" progress notifications of a long step.
PROGRESS_INTERVAL = 1.0
log = logging.getLogger("pippa.mcp")
ERR_CONFIRM = "{reason} Call decide_step again with confirm=true."
# What run_next_step says when nothing ran, naming the tool that goes on.
MCP_PAUSED = "the task is paused; call resume_task to queue it, then run_next_step"
MCP_DECISION = (
    "step {position} is {status}: it waits for a decision; call decision_choices"
    " for the ways forward, then decide_step"
)
MSG_PAUSED = "paused “{title}”: it stops after the step it is on"
MSG_QUEUED = "queued “{title}”: call run_next_step, or let a worker take it"
MSG_CANCELLED = (
    "cancelled “{title}”: no further step starts; the steps and outputs stay"
)
MSG_DECIDED = "step {position}: {label}"


def _worker(worker: str) -> str:
    return door_worker_id(door="mcp", user=current_user(), worker=worker or "agent")


async def _with_heartbeats(ctx, fn, done: float, total: float, label: str):
    """Run ``fn`` in a worker thread, reporting progress every few seconds.

    Progress must grow: while the step runs it creeps towards the next whole
    step. An exception from ``fn`` is raised here.
    """
    result: dict[str, Any] = {}
    finished = anyio.Event()

    async def work():
        try:
            # A thread of its own, not one of the tool threads every user's
            # calls share; pippa_site.slots.STEP_RUNS bounds how many run.
            result["run"] = await in_thread(fn, limiter=anyio.CapacityLimiter(1))
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc
        finally:
            finished.set()

    started = time.monotonic()
    beats = 0
    async with anyio.create_task_group() as group:
        group.start_soon(work)
        while not finished.is_set():
            with anyio.move_on_after(PROGRESS_INTERVAL):
                await finished.wait()
            if not finished.is_set() and ctx is not None:
                beats += 1
                await ctx.report_progress(
                    done + 1 - 1 / (beats + 1),
                    total,
                    f"{label} (still running, {time.monotonic() - started:.0f}s)",
                )
    if "error" in result:
        raise result["error"]
    return result["run"]


def _step_run_answer(task: Task, run: actions.StepRun) -> StepRunAnswer:
    """What run_next_step answers: the run, the step and its output ref, the task."""
    task.refresh_from_db()
    detail = run.detail
    if run.waiting == "paused":
        detail = MCP_PAUSED
    elif run.waiting == "decision" and run.step is not None:
        detail = MCP_DECISION.format(
            position=run.step.position, status=run.step.get_status_display()
        )
    ran = None
    step = run.step
    if step is not None:
        ran = plain_json(step_payload(step))
        if step.output is not None:
            ran["output"].update(
                uri=uri_of("artifact", step.output.pk), **excerpt_of(step.output)
            )
    return StepRunAnswer(
        ran=run.ran,
        detail=detail,
        rule=run.rule,
        step=ran,
        task=task_brief(task, refresh=False),
    )


@tool(title="Run the task's next step", open_world=True)
async def run_next_step(
    task_id: Id,
    ctx: Context | None = None,
    worker: Worker = "",
) -> StepRunAnswer:
    """Run the task's next unfinished step and answer once its result is saved.

    The executor takes the task's lease, calls the step's tool, writes the
    output to durable storage and only then answers (write before show):
    you get the step's status, its output ref (id, sha256, class) and a
    short excerpt. A step left uncertain by a crash is resolved by its
    class instead of being blindly re-run. Call again for the next step
    until the task is done, failed or needs review. A paused task runs
    nothing until resume_task; a step that waits for a decision is answered
    with ran=false: see decision_choices and decide_step. Sends progress
    notifications while a long step runs. If another worker holds the
    lease you get an error saying until when.
    """
    user = current_user()
    # One lease per call, given back when the call ends: an agent may never
    # call again, and a second call under the same name must not mistake
    # this one's step for an abandoned one.
    worker_id = f"{_worker(worker)}#{secrets.token_hex(3)}"

    def prepare():
        task = task_get_for_user(user=user, task_id=task_id)
        upcoming = task.steps.not_done().order_by("position").first()
        return task, upcoming

    task, upcoming = await in_thread(prepare)
    total = max(task.steps_total, 1)
    done = task.steps_done
    label = (
        f"running step {upcoming.position} of {task.steps_total}: {upcoming.title}"
        if upcoming is not None
        else "settling the task"
    )
    if ctx is not None:
        await ctx.report_progress(done, total, label)

    def step_and_release():
        try:
            return actions.step_run(task=task, worker_id=worker_id)
        finally:
            try:
                lease_release_own(task=task, worker_id=worker_id)
            except DatabaseError:
                log.warning("lease of task %s left to expire", task.pk)

    # At most PIPPA_STEP_RUNS_PER_USER of this user's step runs at once in this
    # process (a refusal says so), PIPPA_STEP_RUNS for everyone.
    with STEP_RUNS.hold(user.pk):
        run = await _with_heartbeats(ctx, step_and_release, done, total, label)
    if run.lease_busy:
        raise ToolError(run.detail)

    out = await in_thread(_step_run_answer, task, run)
    # Progress only ever grows, so a call that ran nothing sends no second one.
    if ctx is not None and out.task.steps_done > done:
        await ctx.report_progress(
            out.task.steps_done, max(out.task.steps_total, 1), run.detail
        )
    return out


@tool(title="Record a step you did yourself", idempotent=True)
def complete_step(
    task_id: Id,
    step_id: Id,
    content: Annotated[str, Field(min_length=1, max_length=2 * MAX_STORE_BYTES)],
    media_type: MediaType = "text/plain",
    title: TitleOrEmpty = "",
    source_refs: Annotated[list[Id], Field(max_length=MAX_SOURCES)] = [],  # noqa: B006
    encoding: Literal["text", "base64"] = "text",
    worker: Worker = "",
) -> CompletedStep:
    """Record a step whose work you did yourself: name the step, give its output.

    The output (up to 1 MiB: text, or base64 with encoding='base64') is saved
    exactly like a tool's output: written to durable storage before the step
    is marked done, as an artifact of the step's class, so resume treats it
    by that class's rule. Sending the same bytes again is harmless (the
    answer says already=true); a finished step, a step that waits for a
    decision, or a task another worker holds is refused. The task must be
    queued or running (resume_task first if it is paused). source_refs
    names artifacts the output was made from (lineage). Answers with the
    step, its output ref and the task's progress.
    """
    user = current_user()
    task = task_get_for_user(user=user, task_id=task_id)
    step_get(task, step_id)
    data = content_bytes(content, encoding)
    sources = artifacts_get(user=user, artifact_ids=source_refs)
    completion = actions.step_complete(
        task=task,
        step_id=step_id,
        data=data,
        media_type=media_type,
        title=title,
        source_ids=[s.pk for s in sources],
        worker_id=f"{_worker(worker)}#{secrets.token_hex(3)}",
    )
    out = step_complete_payload(completion, task)
    out["task"]["uri"] = uri_of("task", task.pk)
    if out["step"]["output"]:
        out["step"]["output"]["uri"] = uri_of("artifact", out["step"]["output"]["id"])
    return out


@tool(title="Pause a task", idempotent=True)
def pause_task(task_id: Id) -> TaskActionAnswer:
    """Pause a queued or running task: it stops after the step it is on.

    Nothing runs it (run_next_step included) until resume_task. The same
    action as the dashboard's Pause button.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    actions.task_pause(task=task, actor=actor())
    return TaskActionAnswer(
        message=MSG_PAUSED.format(title=task.title), task=task_brief(task)
    )


@tool(title="Resume a task", idempotent=True)
def resume_task(task_id: Id) -> TaskActionAnswer:
    """Queue a paused or interrupted task again (the dashboard's Resume).

    Refused while a step waits for a decision (see decision_choices) and for
    a done or cancelled task. Then call run_next_step, or let a worker take it.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    actions.task_resume(task=task, actor=actor())
    return TaskActionAnswer(
        message=MSG_QUEUED.format(title=task.title), task=task_brief(task)
    )


@tool(title="Cancel a task for good", destructive=True, idempotent=True)
def cancel_task(task_id: Id) -> TaskActionAnswer:
    """Cancel an unfinished task for good (the dashboard's Cancel).

    A step running now finishes and its output is saved; no further step
    starts. Nothing is deleted. A cancelled task cannot be resumed.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    actions.task_cancel(task=task, actor=actor())
    return TaskActionAnswer(
        message=MSG_CANCELLED.format(title=task.title), task=task_brief(task)
    )


def _decision_doc(decision: actions.Decision) -> DecisionOut:
    step = decision.step
    return DecisionOut(
        step_id=step.pk,
        position=step.position,
        title=step.title,
        tool=step.tool,
        status=step.status,
        side_effects=step.side_effects,
        what_happened=decision.advice.words,
        rule=decision.advice.rule,
        plain_words=decision.plain_words,
        choices=[
            Choice(
                action=c.action,
                label=c.label,
                words=c.words,
                recommended=c.recommended,
                needs_confirm=c.confirm,
                warning=c.warning,
            )
            for c in decision.choices
        ],
    )


@tool(title="List the decisions a task waits for", read_only=True)
def decision_choices(
    task_id: Id, cursor: Cursor = None, limit: Limit = PAGE_ROWS
) -> DecisionPage:
    """List the steps that wait for a decision, each with its ways forward.

    The same choices, in the same words, as the dashboard's decision card:
    adopt (use the saved output), rerun (run the same call again), retry
    (start the step over), skip, fail. The recommended one comes first. A
    choice with needs_confirm reaches outside Pippa again: read its warning,
    and pass confirm=true to decide_step only when you mean it. An empty
    list (the message says so) means nothing waits for you.
    """
    after = cursor_read(cursor, "decision_choices")
    task = task_get_for_user(user=current_user(), task_id=task_id)
    steps = Step.objects.filter(task=task, status__in=actions.ATTENTION_STEPS)
    if after is not None:
        steps = steps.filter(position__gt=after)
    decisions: list[tuple[int, DecisionOut]] = []
    more = False
    for step in steps.order_by("position"):
        step.task = task
        decision = actions.step_decision(step=step, task=task)
        if decision is None:
            continue
        if len(decisions) == limit:
            more = True
            break
        decisions.append((step.position, _decision_doc(decision)))
    return DecisionPage(
        decisions=[d for _, d in decisions],
        next_cursor=cursor_after("decision_choices", decisions[-1][0])
        if more
        else None,
        message=page_message(
            len(decisions),
            more=more,
            first=after is None,
            noun="steps wait for a decision",
            empty=f"No step of task {task.pk} waits for a decision"
            f" (the task is {task.get_status_display()}).",
        ),
    )


@tool(title="Decide a step that waits", destructive=True)
def decide_step(
    task_id: Id,
    step_id: Id,
    action: DecisionAction,
    confirm: Flag = False,
) -> DecideAnswer:
    """Take one of decision_choices' ways forward for a step that waits for a decision.

    Only a choice decision_choices offers now is accepted. One that reaches
    outside Pippa again (needs_confirm) is refused without confirm=true, as
    the dashboard asks for confirmation. The decision is also the go-ahead:
    the task is queued again (unless it leaves it failed or finished); call
    run_next_step to go on.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    step = step_get(task, step_id)
    try:
        actions.step_decide(step=step, action=action, confirmed=confirm, actor=actor())
    except actions.ConfirmationNeeded as exc:
        raise ToolError(ERR_CONFIRM.format(reason=str(exc))) from None
    step.refresh_from_db()
    label = CHOICES[action][0]
    return DecideAnswer(
        message=MSG_DECIDED.format(position=step.position, label=label),
        step=StepState(id=step.pk, position=step.position, status=step.status),
        task=task_brief(task),
    )
