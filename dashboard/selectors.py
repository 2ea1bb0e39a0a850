"""Reads for the dashboard: one selector per region of a page, no lazy loads.

Every selector returns rows with their related objects already joined
(``select_related``) or batched (``prefetch_related``), so a page's number of
queries does not grow with the number of conversations, steps or events.

The conversation page reads task rows only (their denormalised
``steps_total``/``steps_done``), never step or event rows. The task page reads
one page of steps and one page of events: a 10,000-step timeline is shown 100
steps at a time, opening at the page that holds the current step, because
rendering every row made the page take seconds and megabytes for no reader.

Who sees what is ``pippa_site.owners``' rule: the dashboard is where staff see
every row, so its selectors pass ``staff=True``, and the pages read a single
conversation or task through ``tasks.documents``' getters with ``staff=True``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import (
    Count,
    Exists,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, Greatest
from django.http import Http404
from django.utils import timezone

from artifacts.models import Artifact
from artifacts.preview import preview_status
from artifacts.store import BlobError, default_store
from council.models import CouncilRound
from pippa_site.owners import sees_every_row
from tasks.actions import ATTENTION_STEPS, Choice, step_decision
from tasks.models import Conversation, Event, Step, Task, needs_you_q
from tasks.resume import envelope_read, resume_context
from tasks.words import CHOICES, RULE_WORDS, actor_words

ERR_NO_STEP = "No such step of this task."
CONVERSATIONS_PER_PAGE = 50
STEPS_PER_PAGE = 100
EVENTS_PER_PAGE = 50
# Resume advice reads a step's own events (a few queries per step), so the
# timeline asks for it only for the steps that need a person's attention, and
# for at most this many per page. The executor stops at the first step that is
# not done, so more than one such step on a page is already unusual.
MAX_ADVICE_PER_PAGE = 5
EXCERPT_BYTES = 800

ACTIVE = (Task.Status.QUEUED, Task.Status.RUNNING)
ATTENTION = (Task.Status.NEEDS_REVIEW, Task.Status.FAILED)
TEXT_TYPES = (
    "application/json",
    "application/xml",
    "application/x-ndjson",
    "application/csv",
)
RASTER_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
RENDER_TYPES = ("image/svg+xml", "text/html")


# -- conversations -----------------------------------------------------------


def _needs_you_count(outer: str) -> Subquery:
    """Count the steps waiting for a person under ``outer`` (a subquery, no join).

    Reads only the partial index tasks_step_attention's few rows.
    """
    field = "task__conversation" if outer == "conversation" else "task"
    return Coalesce(
        Subquery(
            Step.objects.filter(needs_you_q(), **{field: OuterRef("pk")})
            .order_by()
            .values(field)
            .annotate(n=Count("pk"))
            .values("n")[:1]
        ),
        0,
    )


def conversation_list(
    *, user, query: str = "", needs_you: bool = False
) -> QuerySet[Conversation]:
    """Return the conversations ``user`` may see, newest activity first.

    Each row carries its tasks' totals as annotations (one grouped query), so
    the list never loads task rows one conversation at a time. "Activity" is
    the latest change of the conversation or any of its tasks. ``needs_you``
    keeps only conversations with a step waiting for a person.
    """
    conversations = Conversation.objects.for_user(user, staff=True)
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
            needs_you_count=_needs_you_count("conversation"),
            activity_at=Greatest(
                "updated_at", Coalesce(Max("tasks__updated_at"), "updated_at")
            ),
        )
        .filter(**({"needs_you_count__gt": 0} if needs_you else {}))
        .order_by("-activity_at", "-pk")
    )


def conversation_page(
    *, user, query: str = "", page: str | int | None = 1, needs_you: bool = False
) -> Page:
    paginator = Paginator(
        conversation_list(user=user, query=query, needs_you=needs_you),
        CONVERSATIONS_PER_PAGE,
    )
    return paginator.get_page(page)


def conversations_needing_you(*, user) -> int:
    """How many of ``user``'s conversations have a step waiting for a person."""
    return (
        Conversation.objects.for_user(user, staff=True)
        .filter(
            Exists(
                Step.objects.filter(needs_you_q(), task__conversation=OuterRef("pk"))
            )
        )
        .count()
    )


def conversation_tasks(*, conversation: Conversation) -> list[Task]:
    """Return the conversation's tasks in order, each with its "needs you" count.

    Task rows only; the count is a subquery over the few steps the partial
    index tasks_step_attention holds.
    """
    return list(
        Task.objects.filter(conversation=conversation)
        .select_related("branched_from")
        .annotate(needs_you_count=_needs_you_count("task"))
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


def task_last_seq_for_user(*, user, task_id: int) -> int:
    """Return the task's last event seq, or raise Http404 like
    ``tasks.documents.task_get_for_user`` (staff see every task).

    The live timeline's idle poll asks only this, every 2 s from every open
    tab: one indexed row in plain SQL instead of the task with its joins. The
    owner rule is ``TaskQuerySet.for_user``'s, written as SQL.
    """
    q = connection.ops.quote_name
    everyone = sees_every_row(user, staff=True)
    sql = (
        f"SELECT t.last_seq FROM {q(Task._meta.db_table)} t"
        f" JOIN {q(Conversation._meta.db_table)} c ON c.id = t.conversation_id"
        " WHERE t.id = %s" + ("" if everyone else " AND c.owner_id = %s")
    )
    params = [int(task_id)] if everyone else [int(task_id), user.pk]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise Http404("No Task matches the given query.")
    return row[0]


def step_get_for_user(*, user, task_id: int, step_id: int) -> Step:
    """Return one step of a task ``user`` may see, or raise Http404."""
    return (
        Step.objects.filter(task_id=task_id)
        .select_related("task", "task__conversation", "output")
        .get_for_user(user, step_id, staff=True, error=ERR_NO_STEP)
    )


@dataclass
class Attempt:
    """One call of a step's tool, folded from the step's own events."""

    number: int
    generation: int
    started_at: Any
    worker: str = ""
    ended_at: Any = None
    # running, done, failed, interrupted (its worker stopped mid-call), reused
    outcome: str = "running"
    error: str = ""
    note: str = ""  # how an interrupted call was sorted out, in words
    # On the task's time axis, in milliseconds from its first call: absolute,
    # so a settled row stays right while the axis grows (see TaskClock).
    bar_x: int = 0
    bar_w: int = 0

    @property
    def duration(self):
        if self.started_at and self.ended_at:
            return self.ended_at - self.started_at
        return None


@dataclass
class StepNote:
    """Something a person (or the next worker) did to a step, in words."""

    at: Any
    words: str
    actor: str = ""


@dataclass
class SavedOutput:
    """The output a step's interrupted call saved but never recorded."""

    sha: str
    size: int
    media_type: str
    title: str
    preview: str = ""  # "image", "excerpt", "" (shown only as a download)
    excerpt: str = ""
    excerpt_truncated: bool = False


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
    attempts: list[Attempt] = field(default_factory=list)
    notes: list[StepNote] = field(default_factory=list)
    saved: SavedOutput | None = None
    choices: list[Choice] = field(default_factory=list)
    plain_words: str = ""  # what resume will do, in Dad's words
    # A settled row's identity (see settled_row_key) and, when it was drawn
    # before, its HTML: such a row reads no blob excerpt and no events.
    key: tuple | None = None
    html: str = ""

    @property
    def needs_attention(self) -> bool:
        return self.step.status in ATTENTION_STEPS

    @property
    def reusable(self) -> bool:
        """Whether the row's HTML may be shown again while its key holds.

        Only a settled row that shows no relative time ("5 min ago" lives in
        the attempts fold and notes) and no missing blob, which may come back.
        """
        return (
            self.key is not None
            and self.advice is None
            and len(self.attempts) <= 1
            and not self.failed_attempts
            and not self.notes
            and self.preview != "missing"
        )

    @property
    def failed_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome in ("failed", "interrupted")]


def _preview_kind(artifact: Artifact) -> str:
    return _media_kind(artifact.media_type)


def _media_kind(media_type: str) -> str:
    media = media_type.split(";")[0].strip().lower()
    if media in RASTER_TYPES:
        return "image"
    if media in RENDER_TYPES:
        return "render"
    if media.startswith("text/") or media in TEXT_TYPES or media.endswith("+json"):
        return "excerpt"
    return "binary"


def _excerpt(artifact: Artifact, heads: dict | None = None) -> tuple[str, bool, bool]:
    """Return (text, truncated, missing) for the head of a text artifact
    (from ``heads``, a page's heads read at once, when given)."""
    if heads is not None:
        head = heads.get(artifact.sha256)
        return _excerpt_of(head) if head is not None else ("", False, True)
    return _blob_excerpt(artifact.sha256)


def _blob_excerpt(sha: str) -> tuple[str, bool, bool]:
    """Return (text, truncated, missing) for the head of a text blob."""
    try:
        with default_store().open(sha) as fh:
            head = fh.read(EXCERPT_BYTES + 1)
    except (BlobError, OSError):
        return "", False, True
    return _excerpt_of(head)


def _excerpt_of(head: bytes) -> tuple[str, bool, bool]:
    truncated = len(head) > EXCERPT_BYTES
    return head[:EXCERPT_BYTES].decode("utf-8", errors="replace"), truncated, False


def _step_row(step: Step, heads: dict | None = None) -> StepRow:
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
        row.excerpt, row.excerpt_truncated, missing = _excerpt(artifact, heads)
        if missing:
            row.preview = "missing"
    return row


def _advise(rows: list[StepRow], task: Task) -> None:
    """Attach resume advice (and the allowed resolutions) to steps that need a person.

    A running step under a live lease is just running; a step whose advice is
    to wait or run needs no decision, so it gets no card. A cancelled task
    asks for no decision either.
    """
    if task.status == Task.Status.CANCELLED:
        return
    attention = [r for r in rows if r.needs_attention][:MAX_ADVICE_PER_PAGE]
    if not attention:
        return

    for row in attention:
        decision = step_decision(step=row.step, task=task)
        if decision is None:
            continue
        row.advice = decision.advice
        row.plain_words = decision.plain_words
        row.resolve_options = decision.options
        if "adopt" in row.resolve_options:
            row.saved = saved_output(envelope_read(row.step.pk).payload)
        row.choices = decision.choices


def saved_output(payload: dict | None) -> SavedOutput | None:
    """Describe an envelope's saved payload for the "use it" choice (no artifact row yet)."""
    if not payload or not payload.get("sha"):
        return None
    media = str(payload.get("media_type") or "application/octet-stream")
    saved = SavedOutput(
        sha=payload["sha"],
        size=int(payload.get("size") or 0),
        media_type=media,
        title=str(payload.get("title") or ""),
    )
    kind = _media_kind(media)
    if kind == "image":
        saved.preview = "image"
    elif kind == "excerpt":
        text, saved.excerpt_truncated, missing = _blob_excerpt(saved.sha)
        if not missing:
            saved.preview, saved.excerpt = "excerpt", text
    return saved


def current_step_page(*, task: Task) -> int:
    """Return the timeline page that holds the first step not yet done.

    Uses the denormalised ``steps_done``: steps run in order, so the current
    step is step ``steps_done + 1``.
    """
    return min(task.steps_done, max(task.steps_total - 1, 0)) // STEPS_PER_PAGE + 1


def _untouched(step: Step) -> bool:
    return (
        step.status == Step.Status.PENDING
        and not step.attempts
        and step.next_attempt_at is None
    )


# The same rule as a filter (a live update reads the unsettled steps always).
SETTLED_Q = Q(status__in=Step.Status.finished()) | Q(
    status=Step.Status.PENDING, attempts=0, next_attempt_at__isnull=True
)


def settled_row_key(step: Step, task: Task, clock: TaskClock) -> tuple | None:
    """Return what a settled step's timeline row is drawn from, or None.

    Settled (SETTLED_Q): done, skipped, or pending and never attempted (no
    relative time to show). Such a step changes only through a transition
    that changes one of these (a retry, a resolution, a new generation, a
    new output, a rendered preview); the clock's start places its bars.
    Nothing else of the task goes in (its branch link, shown once the task is
    idle, is put in on the way out: dashboard.rows).
    """
    if not step.is_finished and not _untouched(step):
        return None
    out = step.output
    output = (
        None
        if out is None
        else (
            out.pk,
            out.sha256,
            out.size,
            out.media_type,
            out.title,
            repr(preview_status(out)),
        )
    )
    return (
        task.pk,
        task.steps_total,
        clock.started_at,
        step.pk,
        step.position,
        step.status,
        step.title,
        step.attempts,
        step.max_attempts,
        step.generation,
        step.started_at,
        step.finished_at,
        step.error,
        step.side_effects,
        step.artifact_class,
        output,
    )


DrawnLookup = Callable[[tuple], str | None]


def task_timeline(
    *, task: Task, page: str | int | None = None, drawn: DrawnLookup | None = None
) -> tuple[Page, list[StepRow], TaskClock]:
    """Return one page of the task's steps, with previews and resume advice,
    and the task's clock with every attempt's bar placed on it.

    ``drawn(key)`` returns a settled row's HTML drawn earlier, if any: such
    a row is not read again (no blob excerpt, none of its events).
    """
    steps = Step.objects.filter(task=task).select_related("output").order_by("position")
    paginator = Paginator(steps, STEPS_PER_PAGE)
    step_page = paginator.get_page(page or current_step_page(task=task))
    clock = task_clock(task=task)
    return step_page, _rows(step_page.object_list, task, clock, drawn), clock


def task_timeline_changes(
    *, task: Task, page: int, since: int, drawn: DrawnLookup | None = None
) -> tuple[list[StepRow], TaskClock]:
    """Return the rows of one timeline page that a page drawn at event
    ``since`` lacks, and the task's clock.

    Those are the steps with an event after ``since`` (every change of a step
    is logged with the step) and the unsettled ones, which show relative
    times ("started 5 s ago") and running bars that reach "now". One query
    for the steps (index tasks_event_task_seq_uniq reads only the events
    after ``since``), none for the rows of the page that did not change.
    """
    low = (page - 1) * STEPS_PER_PAGE
    touched = Event.objects.filter(task=task, seq__gt=since, step__isnull=False).values(
        "step_id"
    )
    steps = (
        Step.objects.filter(
            task=task, position__gt=low, position__lte=low + STEPS_PER_PAGE
        )
        .filter(Q(pk__in=touched) | ~SETTLED_Q)
        .select_related("output")
        .order_by("position")
    )
    clock = task_clock(task=task)
    return _rows(steps, task, clock, drawn), clock


def _rows(steps, task: Task, clock: TaskClock, drawn: DrawnLookup | None):
    rows = []
    keyed = []
    for step in steps:
        step.task = task  # the page already holds it; resume advice reads it
        key = settled_row_key(step, task, clock)
        html = drawn(key) if key is not None and drawn is not None else None
        keyed.append((step, key, html))
    # The text outputs' heads, read from their files in one pass.
    heads = default_store().heads(
        [
            step.output.sha256
            for step, _, html in keyed
            if not html
            and step.output is not None
            and _preview_kind(step.output) == "excerpt"
        ],
        EXCERPT_BYTES + 1,
    )
    for step, key, html in keyed:
        row = StepRow(step=step, html=html) if html else _step_row(step, heads)
        row.key = key
        rows.append(row)
    fresh = [row for row in rows if not row.html]
    _advise(fresh, task)
    _attempts(fresh)
    _place_bars(clock, fresh)
    return rows


# Step events that tell the story of its attempts (index tasks_event_step_seq).
ATTEMPT_KINDS = (
    Event.Kind.TOOL_CALL_STARTED,
    Event.Kind.TOOL_CALL_FAILED,
    Event.Kind.TOOL_RESULT_PERSISTED,
    Event.Kind.UNCERTAIN_RESOLVED,
    Event.Kind.STEP_RETRIED,
    Event.Kind.STEP_RESOLVED,
    Event.Kind.STEP_NEEDS_REVIEW,
    Event.Kind.STEP_SKIPPED,
)


def _attempts(rows: list[StepRow]) -> None:
    """Fold each step's events into its attempts and notes: one query for the page."""
    by_id = {row.step.pk: row for row in rows}
    if not by_id:
        return
    events = (
        Event.objects.filter(step_id__in=list(by_id), kind__in=ATTEMPT_KINDS)
        .order_by("seq")
        .values_list("step_id", "kind", "data", "created_at")
    )
    for step_id, kind, data, at in events:
        row = by_id[step_id]
        data = data if isinstance(data, dict) else {}
        current = row.attempts[-1] if row.attempts else None
        open_call = current is not None and current.outcome == "running"
        if kind == Event.Kind.TOOL_CALL_STARTED:
            if open_call:
                current.outcome = "interrupted"
            row.attempts.append(
                Attempt(
                    number=int(data.get("attempt") or len(row.attempts) + 1),
                    generation=int(data.get("generation") or 0),
                    started_at=at,
                    worker=str(data.get("worker") or ""),
                )
            )
        elif kind == Event.Kind.TOOL_CALL_FAILED and open_call:
            current.outcome, current.ended_at = "failed", at
            current.error = str(data.get("error") or "")
        elif kind == Event.Kind.TOOL_RESULT_PERSISTED and current is not None:
            if current.outcome in ("running", "interrupted"):
                current.outcome = "done" if current.outcome == "running" else "reused"
                current.ended_at = current.ended_at or at
        elif kind == Event.Kind.UNCERTAIN_RESOLVED and current is not None:
            if open_call:
                current.outcome = "interrupted"
            rule = str(data.get("rule") or "")
            current.note = (
                f"{actor_words(str(data.get('worker') or ''))} found this call"
                f" unfinished. {RULE_WORDS.get(rule, str(data.get('words') or ''))}"
            ).strip()
        elif kind == Event.Kind.STEP_RETRIED:
            if open_call:
                current.outcome = "interrupted"
            row.notes.append(
                StepNote(at, "started the step over as a new request", _actor(data))
            )
        elif kind == Event.Kind.STEP_RESOLVED:
            if open_call:
                current.outcome = "interrupted"
            label = CHOICES.get(str(data.get("action")), (str(data.get("action")), ""))
            row.notes.append(StepNote(at, f"chose “{label[0]}”", _actor(data)))
        elif kind == Event.Kind.STEP_NEEDS_REVIEW:
            reason = str(data.get("reason") or "")
            row.notes.append(StepNote(at, f"set aside for a person: {reason}", ""))
        elif kind == Event.Kind.STEP_SKIPPED:
            row.notes.append(StepNote(at, "skipped", _actor(data)))


def _actor(data: dict) -> str:
    return actor_words(str(data.get("actor") or ""))


@dataclass
class TaskClock:
    """Where the task's time went: its span, on which the steps' bars are drawn.

    Bars are in milliseconds from the first call, so a row drawn earlier stays
    right as the task goes on; only the axis (``span_ms``, each bar's
    ``viewBox``) grows to "now".
    """

    started_at: Any = None
    ended_at: Any = None

    @property
    def elapsed(self):
        if self.started_at and self.ended_at:
            return self.ended_at - self.started_at
        return None

    @property
    def span_ms(self) -> int:
        elapsed = self.elapsed
        return max(1, round(elapsed.total_seconds() * 1000)) if elapsed else 1


def task_clock(*, task: Task) -> TaskClock:
    """Return the task's span: from its first call to its end (or now, while it
    runs). One aggregate query over the task's steps."""
    span = Step.objects.filter(task=task).aggregate(
        first=Min("started_at"), last=Max("finished_at")
    )
    clock = TaskClock(started_at=span["first"])
    if clock.started_at is None:
        return clock
    if task.is_idle:
        clock.ended_at = task.finished_at or span["last"] or timezone.now()
    else:
        clock.ended_at = timezone.now()
    clock.ended_at = max(clock.ended_at, clock.started_at)
    return clock


def _ms(delta) -> int:
    return round(delta.total_seconds() * 1000)


def _place_bars(clock: TaskClock, rows: list[StepRow]) -> None:
    """Place every attempt's bar on the clock, in ms from the task's first call."""
    if clock.started_at is None:
        return
    for row in rows:
        attempts = row.attempts
        for i, attempt in enumerate(attempts):
            end = attempt.ended_at
            if end is None:
                # An open call runs until now; an interrupted one until the next start.
                later = attempts[i + 1].started_at if i + 1 < len(attempts) else None
                end = later or (
                    clock.ended_at
                    if attempt.outcome == "running"
                    else attempt.started_at
                )
            attempt.bar_x = max(0, _ms(attempt.started_at - clock.started_at))
            attempt.bar_w = max(1, _ms(end - attempt.started_at))


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
    return json.dumps(resume_context(task), indent=2, default=str, sort_keys=False)
