"""Reads for the dashboard: one selector per region of a page, no lazy loads.

Every selector returns rows with their related objects already joined
(``select_related``) or batched (``prefetch_related``), so a page's number of
queries does not grow with the number of conversations, steps or events.

The conversation page reads task rows only (their denormalised
``steps_total``/``steps_done``), never step or event rows. The task page reads
one page of steps and one page of events: a 10,000-step timeline is shown 100
steps at a time, opening at the page that holds the current step, because
rendering every row made the page take seconds and megabytes for no reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from artifacts.models import Artifact
from artifacts.preview import preview_status
from artifacts.store import BlobError, default_store
from council.models import CouncilRound
from tasks.models import Conversation, Event, Step, Task

CONVERSATIONS_PER_PAGE = 50
STEPS_PER_PAGE = 100
EVENTS_PER_PAGE = 50
# Resume advice reads a step's own events (a few queries per step), so the
# timeline asks for it only for the steps that need a person's attention, and
# for at most this many per page. The executor stops at the first step that is
# not done, so more than one such step on a page is already unusual.
MAX_ADVICE_PER_PAGE = 5
EXCERPT_BYTES = 800
# Resume advice actions that need no decision from a person.
NO_DECISION = ("wait", "run", "none")

ACTIVE = (Task.Status.QUEUED, Task.Status.RUNNING)
ATTENTION = (Task.Status.NEEDS_REVIEW, Task.Status.FAILED)
ATTENTION_STEPS = (Step.Status.RUNNING, Step.Status.NEEDS_REVIEW, Step.Status.FAILED)
TEXT_TYPES = (
    "application/json",
    "application/xml",
    "application/x-ndjson",
    "application/csv",
)
RASTER_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
RENDER_TYPES = ("image/svg+xml", "text/html")


# -- conversations -----------------------------------------------------------


def conversation_list(*, user, query: str = "") -> QuerySet[Conversation]:
    """Return the conversations ``user`` may see, newest activity first.

    Each row carries its tasks' totals as annotations (one grouped query), so
    the list never loads task rows one conversation at a time.
    """
    conversations = Conversation.objects.for_user(user)
    query = query.strip()
    if query:
        task_match = Task.objects.filter(
            conversation=OuterRef("pk"), title__icontains=query
        )
        conversations = conversations.filter(
            Q(title__icontains=query) | Exists(task_match)
        )
    return (
        conversations.select_related("owner")
        .annotate(
            task_count=Count("tasks"),
            active_count=Count("tasks", filter=Q(tasks__status__in=ACTIVE)),
            attention_count=Count("tasks", filter=Q(tasks__status__in=ATTENTION)),
            done_count=Count("tasks", filter=Q(tasks__status=Task.Status.DONE)),
            paused_count=Count("tasks", filter=Q(tasks__status=Task.Status.PAUSED)),
            steps_total_sum=Coalesce(Sum("tasks__steps_total"), 0),
            steps_done_sum=Coalesce(Sum("tasks__steps_done"), 0),
            # A subquery, not a second join: joining rounds too would multiply
            # the task rows and inflate every sum above.
            round_count=Coalesce(
                Subquery(
                    CouncilRound.objects.filter(conversation=OuterRef("pk"))
                    .order_by()
                    .values("conversation")
                    .annotate(n=Count("pk"))
                    .values("n")[:1]
                ),
                0,
            ),
        )
        .order_by("-updated_at", "-pk")
    )


def conversation_page(*, user, query: str = "", page: str | int | None = 1) -> Page:
    paginator = Paginator(
        conversation_list(user=user, query=query), CONVERSATIONS_PER_PAGE
    )
    return paginator.get_page(page)


def conversation_get_for_user(*, user, conversation_id: int) -> Conversation:
    """Return the conversation, or raise Http404 if ``user`` may not see it."""
    return get_object_or_404(
        Conversation.objects.for_user(user).select_related("owner"),
        pk=conversation_id,
    )


def conversation_tasks(*, conversation: Conversation) -> list[Task]:
    """Return the conversation's tasks in order: task rows only, no steps."""
    return list(
        Task.objects.filter(conversation=conversation)
        .select_related("branched_from")
        .order_by("created_at", "pk")
    )


def conversation_rounds(*, conversation: Conversation) -> list[CouncilRound]:
    """Return the conversation's council rounds with participants and turn counts."""
    return list(
        CouncilRound.objects.filter(conversation=conversation)
        .annotate(turn_count=Count("turns", distinct=True))
        .prefetch_related("participants")
        .order_by("number")
    )


# -- tasks ---------------------------------------------------------------------


def task_get_for_user(*, user, task_id: int) -> Task:
    """Return the task, or raise Http404 if ``user`` may not see its conversation."""
    return get_object_or_404(
        Task.objects.filter(
            conversation__in=Conversation.objects.for_user(user)
        ).select_related("conversation", "conversation__owner", "branched_from"),
        pk=task_id,
    )


def step_get_for_user(*, user, task_id: int, step_id: int) -> Step:
    """Return one step of a task ``user`` may see, or raise Http404."""
    return get_object_or_404(
        Step.objects.filter(
            task_id=task_id,
            task__conversation__in=Conversation.objects.for_user(user),
        ).select_related("task", "task__conversation", "output"),
        pk=step_id,
    )


@dataclass
class StepRow:
    """One timeline row: the step and what the page shows of its output."""

    step: Step
    # "", "image", "render", "no-preview", "excerpt", "binary", "missing"
    preview: str = ""
    excerpt: str = ""
    excerpt_truncated: bool = False
    advice: Any = None  # tasks.resume.ResumeAdvice
    resolve_options: list[str] = field(default_factory=list)

    @property
    def needs_attention(self) -> bool:
        return self.step.status in ATTENTION_STEPS


def _preview_kind(artifact: Artifact) -> str:
    media = artifact.media_type.split(";")[0].strip().lower()
    if media in RASTER_TYPES:
        return "image"
    if media in RENDER_TYPES:
        return "render"
    if media.startswith("text/") or media in TEXT_TYPES or media.endswith("+json"):
        return "excerpt"
    return "binary"


def _excerpt(artifact: Artifact) -> tuple[str, bool, bool]:
    """Return (text, truncated, missing) for the head of a text artifact."""
    try:
        with default_store().open(artifact.sha256) as fh:
            head = fh.read(EXCERPT_BYTES + 1)
    except (BlobError, OSError):
        return "", False, True
    truncated = len(head) > EXCERPT_BYTES
    return head[:EXCERPT_BYTES].decode("utf-8", errors="replace"), truncated, False


def _step_row(step: Step) -> StepRow:
    row = StepRow(step=step)
    artifact = step.output
    if artifact is None:
        return row
    row.preview = _preview_kind(artifact)
    if row.preview == "render":
        # A widget is shown only as its PNG preview, and only when one was
        # rendered (recorded in the widget's own meta: no extra query).
        state = preview_status(artifact)
        if state.get("status") != "ok":
            row.preview = "no-preview"
            row.excerpt = str(state.get("reason") or "")
    if row.preview == "excerpt":
        row.excerpt, row.excerpt_truncated, missing = _excerpt(artifact)
        if missing:
            row.preview = "missing"
    return row


def _advise(rows: list[StepRow], task: Task) -> None:
    """Attach resume advice (and the allowed resolutions) to steps that need a person.

    A running step under a live lease is just running; a step whose advice is
    to wait or run needs no decision, so it gets no card.
    """
    attention = [r for r in rows if r.needs_attention][:MAX_ADVICE_PER_PAGE]
    if not attention:
        return
    from tasks.executor import step_resolve_options
    from tasks.resume import resume_advice

    for row in attention:
        advice = resume_advice(row.step, task=task)
        if advice.action in NO_DECISION:
            continue
        row.advice = advice
        row.resolve_options = list(step_resolve_options(row.step))


def current_step_page(*, task: Task) -> int:
    """Return the timeline page that holds the first step not yet done.

    Uses the denormalised ``steps_done``: steps run in order, so the current
    step is step ``steps_done + 1``.
    """
    return min(task.steps_done, max(task.steps_total - 1, 0)) // STEPS_PER_PAGE + 1


def task_timeline(
    *, task: Task, page: str | int | None = None
) -> tuple[Page, list[StepRow]]:
    """Return one page of the task's steps, with previews and resume advice."""
    steps = Step.objects.filter(task=task).select_related("output").order_by("position")
    paginator = Paginator(steps, STEPS_PER_PAGE)
    step_page = paginator.get_page(page or current_step_page(task=task))
    for step in step_page.object_list:
        step.task = task  # the page already holds it; resume advice reads it
    rows = [_step_row(step) for step in step_page.object_list]
    _advise(rows, task)
    return step_page, rows


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


def task_events(*, task: Task, kind: str = "", before: int | None = None) -> EventPage:
    """Return up to EVENTS_PER_PAGE events of the task, newest first.

    Keyset paging on ``seq`` (index tasks_event_task_kind) instead of page
    numbers: no COUNT over 100,000 rows, and the cost of a page does not
    depend on how deep it is.
    """
    events = Event.objects.filter(task=task).select_related("step")
    if kind:
        events = events.filter(kind=kind)
    if before is not None:
        events = events.filter(seq__lt=before)
    rows = list(events.order_by("-seq")[: EVENTS_PER_PAGE + 1])
    older_than = rows[EVENTS_PER_PAGE - 1].seq if len(rows) > EVENTS_PER_PAGE else None
    return EventPage(
        events=rows[:EVENTS_PER_PAGE], kind=kind, before=before, older_than=older_than
    )


def event_kinds() -> list[str]:
    return list(Event.Kind.values)


def task_resume_context_json(*, task: Task) -> str:
    """Return the document a resumed brain reads, pretty-printed."""
    from tasks.resume import resume_context

    return json.dumps(resume_context(task), indent=2, default=str, sort_keys=False)
