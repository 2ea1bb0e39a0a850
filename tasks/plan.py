"""A task's plan: an ordered step list, created once and rewritten like a todo list."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from pippa_site.errors import Conflict, Invalid
from pippa_site.text import (
    TITLE_MAX,
    TextError,
    json_check,
    text_check,
    title_clean,
)
from tasks.models import Conversation, Event, Step, Task
from tasks.services import conversation_create, events_append
from tasks.tools import ToolNotFound, tool_get

MAX_ARGS_CHARS = 2048
MAX_STEPS = 200

ERR_NO_STEPS = "a plan needs at least one step"
ERR_TOO_MANY_STEPS = f"a plan may have at most {MAX_STEPS} steps"
ERR_STEP_NOT_DICT = "step {n}: each step is a dict with title, tool and args"
ERR_NO_TITLE = "step {n}: a step needs a title"
ERR_ARGS_NOT_DICT = "step {n}: args must be a dict"
ERR_ARGS_TOO_LARGE = (
    f"step {{n}}: args must stay small (under {MAX_ARGS_CHARS} characters of JSON);"
    " pass refs, not payloads"
)
ERR_ARGS_NOT_JSON = "step {n}: args must be plain JSON values"
ERR_BAD_MAX_ATTEMPTS = "step {n}: max_attempts must be a whole number from 1 to 1000"
ERR_UNKNOWN_STEP = "step id {id} is not part of this task"
ERR_STEP_TWICE = "step id {id} appears twice in the new plan"
ERR_DONE_CHANGED = (
    "step {position} is {status}: its title, tool and args cannot change"
    " (retry or branch instead)"
)
ERR_STARTED_DROPPED = (
    "step {position} is {status} and has history (it was attempted or finished);"
    " it cannot be dropped"
)
ERR_DONE_ORDER = (
    "finished steps must stay first and in their order; step {position} moved"
)
ERR_STARTED_ORDER = "attempted steps keep their order; step {position} moved"
ERR_LEASED = "a worker is running this task right now; pause it or wait for the step"
ERR_STATUS_CHANGED = (
    "step {position} is {status}, not {claimed}: a plan rewrite never changes a"
    " step's status (the executor runs steps; retry or resolve one that needs it)"
)
ERR_NEW_STATUS = "step {n} is new, so its status can only be pending, not {claimed}"
ERR_BAD_STATUS = "step {n}: status must be one of {choices}"


class PlanError(Invalid):
    """A plan that cannot be (400 at the API)."""


class PlanConflict(Conflict, PlanError):
    """A plan that would change the task's history or a running task (409)."""


def _clean_step(raw: Any, n: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise PlanError(ERR_STEP_NOT_DICT.format(n=n))
    title = title_clean(str(raw.get("title") or "")).strip()
    if not title:
        raise PlanError(ERR_NO_TITLE.format(n=n))
    try:
        found = tool_get(str(raw.get("tool") or ""))
    except ToolNotFound as exc:
        raise PlanError(f"step {n}: {exc}") from None
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise PlanError(ERR_ARGS_NOT_DICT.format(n=n))
    try:
        text_check(str(raw.get("title") or ""), field=f"step {n}: title")
        json_check(args, field=f"step {n}: args")
    except TextError as exc:
        raise PlanError(str(exc)) from None
    try:
        encoded = json.dumps(args, allow_nan=False)
    except (TypeError, ValueError):
        raise PlanError(ERR_ARGS_NOT_JSON.format(n=n)) from None
    if len(encoded) > MAX_ARGS_CHARS:
        raise PlanError(ERR_ARGS_TOO_LARGE.format(n=n))
    max_attempts = raw.get("max_attempts", settings.PIPPA_MAX_ATTEMPTS)
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= 1000
    ):
        raise PlanError(ERR_BAD_MAX_ATTEMPTS.format(n=n))
    return {
        "title": title[:TITLE_MAX],
        "tool": found.name,
        "args": args,
        "artifact_class": found.artifact_class,
        "side_effects": found.side_effects,
        "max_attempts": max_attempts,
    }


def _claimed_status(raw: Any, n: int) -> str | None:
    """The status a plan item says its step has, if it says one."""
    if not isinstance(raw, dict) or raw.get("status") in (None, ""):
        return None
    claimed = raw["status"]
    if claimed not in Step.Status.values:
        raise PlanError(
            ERR_BAD_STATUS.format(n=n, choices=", ".join(Step.Status.values))
        )
    return claimed


@transaction.atomic
def task_create(
    *,
    conversation: Conversation,
    title: str,
    steps: list[dict],
    brain: str = "scripted",
    queue: bool = True,
) -> Task:
    """Create a task with its ordered steps; queue it for a worker unless told not to.

    The tool registry fills each step's artifact class and side-effect flag, so
    the resume rule is fixed when the plan is made.
    """
    if not steps:
        raise PlanError(ERR_NO_STEPS)
    if len(steps) > MAX_STEPS:
        raise PlanError(ERR_TOO_MANY_STEPS)
    try:
        text_check(title, field="title")
    except TextError as exc:
        raise PlanError(str(exc)) from None
    for n, raw in enumerate(steps, start=1):
        claimed = _claimed_status(raw, n)
        if claimed is not None and claimed != Step.Status.PENDING:
            raise PlanError(ERR_NEW_STATUS.format(n=n, claimed=claimed))
    cleaned = [_clean_step(raw, n) for n, raw in enumerate(steps, start=1)]
    now = timezone.now()
    task = Task.objects.create(
        conversation=conversation,
        title=(title_clean(title).strip() or "Untitled task")[:TITLE_MAX],
        brain=brain or "scripted",
        status=Task.Status.QUEUED if queue else Task.Status.PAUSED,
        steps_total=len(cleaned),
        created_at=now,
        updated_at=now,
    )
    Step.objects.bulk_create(
        [
            Step(task=task, position=n, created_at=now, **fields)
            for n, fields in enumerate(cleaned, start=1)
        ]
    )
    entries = [
        (
            Event.Kind.TASK_CREATED,
            None,
            {"steps": len(cleaned), "brain": task.brain, "title": task.title[:200]},
        )
    ]
    if queue:
        entries.append((Event.Kind.TASK_QUEUED, None, {"reason": "created"}))
    events_append(task_id=task.pk, entries=entries)
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=now)
    task.refresh_from_db()
    return task


@transaction.atomic
def conversation_task_create(
    *,
    owner,
    conversation_title: str,
    title: str,
    steps: list[dict],
    brain: str = "scripted",
    queue: bool = True,
) -> Task:
    """Create a conversation and its first task; a bad plan leaves neither."""
    conversation = conversation_create(owner=owner, title=conversation_title)
    return task_create(
        conversation=conversation, title=title, steps=steps, brain=brain, queue=queue
    )


@transaction.atomic
def plan_rewrite(*, task: Task, steps: list[dict]) -> Task:
    """Replace a task's plan the way a todo list is rewritten.

    1. Lock the task; refuse while a worker holds a live lease.
    2. Finished (done/skipped) steps must all be listed, first, in their order,
       unchanged: their outputs stand. A dict with ``"id"`` names an existing step.
    3. Attempted steps (running, failed, needs review, or pending with earlier
       attempts) keep their relative order and cannot be dropped: their events
       are history.
    4. Never-attempted pending steps may be reordered, edited or dropped; dicts
       without ``"id"`` are new pending steps.
    A dict may state the ``"status"`` it believes a step has (an agent's todo
    list carries one); a status that differs from the stored one is refused,
    never applied: only the executor moves a step.
    5. Renumber, recount progress, log ``plan_rewritten``; reopen a done task
       that gained steps.
    """
    locked = Task.objects.select_for_update().get(pk=task.pk)
    if locked.lease_live:
        raise PlanConflict(ERR_LEASED)
    if not steps:
        raise PlanError(ERR_NO_STEPS)
    if len(steps) > MAX_STEPS:
        raise PlanError(ERR_TOO_MANY_STEPS)
    rewrite = _Rewrite.read(locked)
    for n, raw in enumerate(steps, start=1):
        rewrite.add(raw, n)
    rewrite.check_history()
    rewrite.write()
    task.refresh_from_db()
    return task


@dataclass
class _Rewrite:
    """One plan rewrite: the task's steps now and the new order being built."""

    task: Task
    existing: dict[int, Step]
    attempted: set[int]  # steps with a tool_call_started: their events are history
    new_order: list[tuple[Step | None, dict[str, Any]]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)

    @classmethod
    def read(cls, task: Task) -> _Rewrite:
        steps = Step.objects.filter(task=task).order_by("position")
        attempted = Event.objects.filter(task=task, kind=Event.Kind.TOOL_CALL_STARTED)
        return cls(
            task=task,
            existing={s.pk: s for s in steps},
            attempted=set(attempted.values_list("step_id", flat=True).distinct()),
        )

    def has_history(self, step: Step) -> bool:
        return step.is_finished or step.pk in self.attempted

    def add(self, raw: Any, n: int) -> None:
        """Rules 2-4 for one item: an existing step kept (maybe edited), or a new one."""
        claimed = _claimed_status(raw, n)
        if not (isinstance(raw, dict) and raw.get("id") is not None):
            if claimed is not None and claimed != Step.Status.PENDING:
                raise PlanError(ERR_NEW_STATUS.format(n=n, claimed=claimed))
            self.new_order.append((None, _clean_step(raw, n)))
            return
        old = self._existing(raw["id"])
        if claimed is not None and claimed != old.status:
            raise PlanConflict(
                ERR_STATUS_CHANGED.format(
                    position=old.position,
                    status=old.get_status_display(),
                    claimed=claimed,
                )
            )
        merged = {
            "title": raw.get("title", old.title),
            "tool": raw.get("tool", old.tool),
            "args": raw.get("args", old.args),
            "max_attempts": raw.get("max_attempts", old.max_attempts),
        }
        if self.has_history(old) and (
            str(merged["title"]).strip()[:TITLE_MAX] != old.title
            or merged["tool"] != old.tool
            or merged["args"] != old.args
        ):
            raise PlanConflict(
                ERR_DONE_CHANGED.format(
                    position=old.position, status=old.get_status_display()
                )
            )
        self.new_order.append((old, _clean_step(merged, n)))

    def _existing(self, raw_id: Any) -> Step:
        try:
            step_id = int(raw_id)
        except (TypeError, ValueError):
            raise PlanError(ERR_UNKNOWN_STEP.format(id=raw_id)) from None
        if step_id not in self.existing:
            raise PlanError(ERR_UNKNOWN_STEP.format(id=step_id))
        if step_id in self.seen:
            raise PlanError(ERR_STEP_TWICE.format(id=step_id))
        self.seen.add(step_id)
        return self.existing[step_id]

    @property
    def new_ids(self) -> list[int | None]:
        return [old.pk if old else None for old, _ in self.new_order]

    def check_history(self) -> None:
        """Rules 2 and 3 across the list: nothing with history dropped or moved."""
        for old in self.existing.values():
            if old.pk not in self.seen and (self.has_history(old) or old.attempts):
                raise PlanConflict(
                    ERR_STARTED_DROPPED.format(
                        position=old.position, status=old.get_status_display()
                    )
                )
        new_ids = self.new_ids
        finished = [s.pk for s in self.existing.values() if s.is_finished]
        if new_ids[: len(finished)] != finished:
            moved = next(
                (
                    self.existing[pk].position
                    for i, pk in enumerate(finished)
                    if i >= len(new_ids) or new_ids[i] != pk
                ),
                0,
            )
            raise PlanConflict(ERR_DONE_ORDER.format(position=moved))
        attempted = [
            s.pk
            for s in self.existing.values()
            if not s.is_finished and (s.pk in self.attempted or s.attempts)
        ]
        kept_order = [pk for pk in new_ids if pk in set(attempted)]
        if kept_order != attempted:
            moved = next(
                self.existing[a].position
                for a, b in zip(attempted, kept_order, strict=True)
                if a != b
            )
            raise PlanConflict(ERR_STARTED_ORDER.format(position=moved))

    def write(self) -> None:
        """Rule 5: drop, renumber, recount, log; reopen a done task that grew."""
        locked = self.task
        dropped = [pk for pk in self.existing if pk not in self.seen]
        # Dropped steps were never attempted, so they carry no events.
        Step.objects.filter(pk__in=dropped).delete()
        # Two passes keep (task, position) unique while positions move.
        offset = 10 * MAX_STEPS + len(self.existing) + len(self.new_order)
        Step.objects.filter(task=locked).update(position=F("position") + offset)
        now = timezone.now()
        added = 0
        for n, (old, fields) in enumerate(self.new_order, start=1):
            if old is None:
                Step.objects.create(task=locked, position=n, created_at=now, **fields)
                added += 1
            elif self.has_history(old):
                Step.objects.filter(pk=old.pk).update(position=n)
            else:
                Step.objects.filter(pk=old.pk).update(position=n, **fields)
        done = Step.objects.filter(task=locked).finished().count()
        total = len(self.new_order)
        changes: dict[str, Any] = {
            "steps_total": total,
            "steps_done": done,
            "updated_at": now,
        }
        if locked.status == Task.Status.DONE and done < total:
            changes.update(status=Task.Status.QUEUED, finished_at=None)
        Task.objects.filter(pk=locked.pk).update(**changes)
        entries = [
            (
                Event.Kind.PLAN_REWRITTEN,
                None,
                {
                    "steps": total,
                    "kept": len(self.seen),
                    "added": added,
                    "dropped": len(dropped),
                    "order": [pk for pk in self.new_ids if pk is not None][:200],
                },
            )
        ]
        if changes.get("status") == Task.Status.QUEUED:
            entries.append((Event.Kind.TASK_QUEUED, None, {"reason": "plan_rewritten"}))
        events_append(task_id=locked.pk, entries=entries)
