"""The task's time axis: its span and the time it spent paused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Max, Min
from django.utils import timezone

from tasks.models import (
    Event,
    Step,
    Task,
)


@dataclass
class TaskClock:
    """Where the task's time went: its span, on which the steps' bars are drawn.

    Bars are in milliseconds from the first call, so a row drawn earlier stays
    right as the task goes on; only the axis (``span_ms``, each bar's
    ``viewBox``) grows to "now". ``worked`` is the span less the time the
    task spent paused: what "Took" and "Running for" say.
    """

    started_at: Any = None
    ended_at: Any = None
    paused: Any = None  # a timedelta: paused between the first call and the end

    @property
    def elapsed(self):
        if self.started_at and self.ended_at:
            return self.ended_at - self.started_at
        return None

    @property
    def worked(self):
        elapsed = self.elapsed
        if elapsed is None or not self.paused:
            return elapsed
        return max(elapsed - self.paused, elapsed * 0)

    @property
    def span_ms(self) -> int:
        elapsed = self.elapsed
        return max(1, round(elapsed.total_seconds() * 1000)) if elapsed else 1


# The task's span and the pause marks inside it, in one statement (the
# clock is read by every page and live update): the span is the first call
# and the last finish of its steps after ``%(low)s`` (a branch's kept steps
# ran in its parent's time); the marks are its pause and resume events from
# the first call on, read from the (task, kind, seq) index
# (tasks_event_task_kind) and sorted here: ordered by seq, SQLite would walk
# every event of the task in seq order (100,000 of them: 15 ms). The span's
# row is the one without a seq.
def task_clock(*, task: Task) -> TaskClock:
    """Return the task's span: from its own first call (a branch's kept steps
    ran in its parent's time) to its end (or now, while it runs), and the
    time it spent paused within it. Two queries: the span, then the pause
    and resume marks within it."""
    branched = task.branched_from_id and task.branched_at
    span = Step.objects.filter(
        task=task, position__gt=task.branched_at if branched else -1
    ).aggregate(first=Min("started_at"), last=Max("finished_at"))
    first, last = span["first"], span["last"]
    marks = []
    if first is not None:
        marks = list(
            Event.objects.filter(
                task=task,
                kind__in=[Event.Kind.TASK_PAUSED, Event.Kind.TASK_QUEUED],
                created_at__gte=first,
            ).values_list("seq", "kind", "created_at")
        )
    clock = TaskClock(started_at=first)
    if clock.started_at is None:
        return clock
    if task.is_idle:
        clock.ended_at = task.finished_at or last or timezone.now()
        if task.status != Task.Status.DONE:
            # Paused, stopped or waiting for a person: its time ends with its
            # last call, not with a person's decision (or none) after it.
            clock.ended_at = _last_call_at(task) or clock.ended_at
    else:
        clock.ended_at = timezone.now()
    clock.ended_at = max(clock.ended_at, clock.started_at)
    clock.paused = _paused_within(sorted(marks), clock.ended_at)
    return clock


# The events that end or start a call: the last of them is when the task last worked.
CALL_KINDS = (
    Event.Kind.TOOL_CALL_STARTED,
    Event.Kind.TOOL_CALL_FAILED,
    Event.Kind.TOOL_RESULT_PERSISTED,
)


def _last_call_at(task: Task):
    """When ``task``'s last call started or ended (newest first: a task's
    last events, found walking back from its newest)."""
    return (
        Event.objects.filter(task_id=task.pk, kind__in=CALL_KINDS)
        .order_by("-seq")
        .values_list("created_at", flat=True)
        .first()
    )


def _paused_within(marks, end):
    """The time between each pause and the resume after it, up to ``end``:
    ``marks`` are (seq, kind, at) of the pause and resume events from the
    first call on, in log order."""
    total = end - end
    since = None
    for _, kind, at in marks:
        if kind == Event.Kind.TASK_PAUSED and since is None:
            since = at
        elif kind == Event.Kind.TASK_QUEUED and since is not None:
            total += min(at, end) - since
            since = None
    if since is not None and since < end:
        total += end - since
    return total


def milliseconds(delta) -> int:
    return round(delta.total_seconds() * 1000)
