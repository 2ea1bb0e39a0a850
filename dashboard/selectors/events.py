"""The task page's engineer's sections: the event log and the resume document."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tasks.models import (
    Event,
    Step,
    Task,
)
from tasks.resume_document import document_text, document_words, resume_payload

EVENTS_PER_PAGE = 50


@dataclass
class EventGroup:
    """Consecutive events of one step and attempt (or of the task itself)."""

    step: Step | None
    attempt: int | None
    events: list[Event] = field(default_factory=list)


@dataclass
class EventPage:
    """A keyset page of a task's events, newest first."""

    events: list[Event]
    kind: str
    before: int | None
    older_than: int | None  # cursor for the next (older) page, None at the end

    @property
    def is_first(self) -> bool:
        return self.before is None

    @property
    def groups(self) -> list[EventGroup]:
        """The page's events grouped by step and attempt, keeping their order."""
        groups: list[EventGroup] = []
        for event in self.events:
            data = event.data if isinstance(event.data, dict) else {}
            attempt = data.get("attempt") if event.step_id else None
            last = groups[-1] if groups else None
            same_step = last is not None and last.step == event.step
            if same_step and attempt is None:
                attempt = last.attempt
            if not same_step or last.attempt != attempt:
                last = EventGroup(step=event.step, attempt=attempt)
                groups.append(last)
            last.events.append(event)
        return groups


# What the events section reads: every field of an event, and of its step
# what a group's head shows (``group.step.position``, ``group.step.title``).
EVENT_FIELDS = tuple(f.name for f in Event._meta.concrete_fields)
EVENT_STEP_FIELDS = ("position", "title")


def task_events(*, task: Task, kind: str = "", before: int | None = None) -> EventPage:
    """Return up to EVENTS_PER_PAGE events of the task, newest first.

    Keyset paging on ``seq`` (index tasks_event_task_kind) instead of page
    numbers: no COUNT over 100,000 rows, and the cost of a page does not
    depend on how deep it is. Each event's step brings only what a group's
    head shows (its position and title): not its args, error and times,
    decoded for every event of the page.
    """
    events = (
        Event.objects.filter(task=task)
        .select_related("step")
        .only(*EVENT_FIELDS, *(f"step__{name}" for name in EVENT_STEP_FIELDS))
    )
    if kind:
        events = events.filter(kind=kind)
    if before is not None:
        events = events.filter(seq__lt=before)
    rows = list(events.order_by("-seq")[: EVENTS_PER_PAGE + 1])
    older_than = rows[EVENTS_PER_PAGE - 1].seq if len(rows) > EVENTS_PER_PAGE else None
    return EventPage(
        events=rows[:EVENTS_PER_PAGE], kind=kind, before=before, older_than=older_than
    )


def event_kinds(*, task: Task) -> list[str]:
    """Return the kinds of event the task has, for its filter (index tasks_event_task_kind)."""
    return sorted(
        Event.objects.filter(task=task)
        .order_by()
        .values_list("kind", flat=True)
        .distinct()
    )


def task_resume_context_json(*, task: Task) -> str:
    """Return the document a resumed brain reads, pretty-printed."""
    return json.dumps(resume_payload(task), indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class ResumeSummary:
    """The task page's resume card: what a brain will be told, in Dad's words."""

    words: str
    chars: int  # the document's size as a brain reads it (compact JSON)


def task_resume_summary(*, task: Task) -> ResumeSummary:
    """Say what the resume document tells a brain now, and how long it is."""
    payload = resume_payload(task)
    return ResumeSummary(
        words=document_words(payload), chars=len(document_text(payload))
    )
