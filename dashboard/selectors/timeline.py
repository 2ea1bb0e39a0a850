"""The task page's step rows: one page of steps, their attempts, notes and advice.

The task page reads one page of steps and one page of events: a 10,000-step
timeline is shown ``STEPS_PER_PAGE`` steps at a time, opening at the page that
holds the current step, because rendering every row made the page take seconds
and megabytes for no reader.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import (
    Q,
)

from artifacts.preview import preview_status
from artifacts.selectors import search_headlines
from dashboard.selectors.clock import TaskClock, milliseconds, task_clock
from dashboard.selectors.outputs import (
    OutputHeads,
    SavedOutput,
    artifact_routes,
    artifact_url,
    output_excerpt,
    preview_kind,
    saved_output,
)
from pippa_site.errors import NotFound
from pippa_site.owners import sees_every_row
from tasks.actions import ATTENTION_STEPS, Choice, step_decision
from tasks.models import (
    Event,
    Step,
    Task,
    lease_dead,
    lease_dead_q,
)
from tasks.resume import envelope_read
from tasks.rules import rule_words
from tasks.words import CHOICES, actor_words

ERR_NO_STEP = "No such step of this task."
# A step never attempted: the fields that say so, read by the live update's
# query (SETTLED_Q) and by the row (StepRow.planned).
NOT_BEGUN = {"status": Step.Status.PENDING, "attempts": 0, "next_attempt_at": None}
# Fifty rows: about ten phone screens. Drawing the rows is most of what a
# page and a live poll cost, and a poll that follows the current step to its
# next page draws them all: under the load bench's 20 viewers, a hundred rows a
# page put the page's and the poll's p95 at two to four times their targets
# (docs/serving-and-bench.md).
STEPS_PER_PAGE = 50
# Resume advice reads a step's own events (a few queries per step), so the
# timeline asks for it only for the steps that need a person's attention, and
# for at most this many per page. The executor stops at the first step that is
# not done, so more than one such step on a page is already unusual.
MAX_ADVICE_PER_PAGE = 5


def task_poll_state_for_user(
    *, user, task_id: int, staff: bool = False
) -> tuple[int, bool]:
    """Return (last event seq, whether a worker holds a live lease) of a task
    ``user`` may see, or raise NotFound like ``task_get_for_user``.

    A live poll compares both with what its page shows: every change of a task
    appends an event, except a worker that stops answering (its lease runs out
    without a word), which the lease's state tells. One indexed row.
    """
    tasks = Task.objects.filter(pk=task_id)
    if not sees_every_row(user, staff=staff):
        tasks = tasks.filter(conversation__owner=user)
    row = tasks.values_list("last_seq", "lease_owner", "lease_expires_at").first()
    if row is None:
        raise NotFound("No Task matches the given query.")
    last_seq, holder, expires = row
    return last_seq, not lease_dead(holder, expires)


def step_in_flight(*, task: Task, rows: list[StepRow] = ()) -> Step | None:
    """Return the step a worker is calling now (its lease is live), or None.

    ``rows``, a page of the task's step rows already read: when the running
    step is among them it is taken from there (a task runs one step at a
    time, in order), else it is read.
    """
    if not task.lease_live:
        return None
    for row in rows:
        if row.step.status == Step.Status.RUNNING:
            return row.step
    return (
        Step.objects.filter(task=task, status=Step.Status.RUNNING)
        .order_by("position")
        .first()
    )


def worker_busy_elsewhere(*, task: Task) -> bool:
    """Whether a worker holds a live lease on another task (any owner's).

    Why a queued task waits: one worker steps one task at a time. Says
    nothing of the other task, which may be another user's.
    """
    return Task.objects.exclude(pk=task.pk).exclude(lease_dead_q()).exists()


def step_get_for_user(*, user, task_id: int, step_id: int, staff: bool = False) -> Step:
    """Return one step of a task ``user`` may see (``pippa_site.owners``), or raise NotFound."""
    return (
        Step.objects.filter(task_id=task_id)
        .select_related("task", "task__conversation", "output")
        .get_for_user(user, step_id, staff=staff, error=ERR_NO_STEP)
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


@dataclass(frozen=True)
class Shown:
    """What a row shows of its output: ``preview`` ("", "image", "render",
    "no-preview", "excerpt", "headlines", "data", "binary", "missing"),
    ``excerpt`` and ``headlines`` (a saved search's)."""

    preview: str = ""
    excerpt: str = ""
    excerpt_truncated: bool = False
    headlines: list[dict] = field(default_factory=list)


@dataclass(eq=False)
class StepRow:
    """One timeline row: the step, its attempts and notes (folded from its
    events), and what the page shows of its output (``Shown``, read when
    the row is drawn: ``preview``, ``excerpt``, ``excerpt_truncated``,
    ``headlines``)."""

    step: Step
    advice: Any = None  # tasks.resume.ResumeAdvice
    resolve_options: list[str] = field(default_factory=list)
    saved: SavedOutput | None = None
    choices: list[Choice] = field(default_factory=list)
    plain_words: str = ""  # what resume will do, in Dad's words
    routes: dict | None = None  # artifact_routes(), once for the list
    heads: OutputHeads | None = None  # its list's text outputs, read once
    attempts: list[Attempt] = field(default_factory=list)
    notes: list[StepNote] = field(default_factory=list)

    @property
    def needs_attention(self) -> bool:
        return self.step.status in ATTENTION_STEPS

    @property
    def planned(self) -> bool:
        """Whether the step has not begun and nothing happened to it (no
        attempt, note, error, output, back-off or stop): the page draws it
        with the short ``step-row-planned``."""
        step = self.step
        return (
            all(getattr(step, name) == value for name, value in NOT_BEGUN.items())
            and not self.attempts
            and not self.notes
            and not step.error
            and step.output_id is None
            and not step.stopped
            and self.advice is None
        )

    @cached_property
    def fragment_key(self) -> str:
        """The key under which the page may keep this row drawn (all of it
        but its bars' axis, which follows the clock) in Django's "fragments"
        cache, or "" for a row that is drawn every time.

        The key is everything those parts show: the step's fields, its
        output's, and what the row read of the step's events. What the row
        shows of the output's bytes (``shown``) follows its output's fields:
        a blob's bytes never change under its sha, and a blob that goes
        missing changes its artifact's ``integrity`` when the doctor finds
        it. So a kept row reads nothing from the store. What depends on the
        reader or on the task (the list item's out-of-band mark, the owner's
        branch link once the task is idle) is not in those parts: a finished
        task keeps its rows, and one reader's row is never another's. A
        changed row has another key, so a key never names a stale row. Drawn
        every time: a row waiting for a person (its card and choices), a
        running step or a back-off ("started 5 s ago"), and a row that lists
        its attempts or notes (their times are relative words).
        """
        step = self.step
        if (
            self.advice is not None
            or self.shows_attempts
            or step.status == Step.Status.RUNNING
            or step.next_attempt_at is not None
        ):
            return ""
        output = step.output
        shown = (
            [getattr(step, f.attname) for f in Step._meta.concrete_fields],
            output
            and [getattr(output, f.attname) for f in output._meta.concrete_fields],
            self.attempts,
            self.worked,
        )
        # Its digest: {% cache %} digests its key again, once for each part.
        return hashlib.sha256(repr(shown).encode()).hexdigest()

    # The output's pages, as ``{% url %}`` gives them (``artifact_url``).
    @property
    def detail_url(self) -> str:
        return artifact_url("detail", self.step.output_id, self.routes)

    @property
    def source_url(self) -> str:
        return artifact_url("source", self.step.output_id, self.routes)

    @property
    def preview_url(self) -> str:
        return artifact_url("preview", self.step.output_id, self.routes)

    @property
    def worked(self):
        """The time its calls took, the waits between them left out (a
        retry's back-off, a person's decision): what "took" says."""
        spans = [a.duration for a in self.attempts if a.duration is not None]
        return sum(spans, spans[0] * 0) if spans else None

    @property
    def failed_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome in ("failed", "interrupted")]

    @property
    def shows_attempts(self) -> bool:
        """Whether the row unfolds its attempts and notes (more than one, one
        that did not finish, or something a person did)."""
        return len(self.attempts) > 1 or bool(self.failed_attempts or self.notes)

    @cached_property
    def shown(self) -> Shown:
        """What the row shows of its output, read when the row is drawn."""
        return _shown(self.step.output, self.heads)

    @property
    def preview(self) -> str:
        return self.shown.preview

    @property
    def excerpt(self) -> str:
        return self.shown.excerpt

    @property
    def excerpt_truncated(self) -> bool:
        return self.shown.excerpt_truncated

    @property
    def headlines(self) -> list[dict]:
        return self.shown.headlines


def _shown(artifact, heads: OutputHeads | None) -> Shown:
    """What a row shows of ``artifact`` (``heads``: its list's text outputs'
    first bytes, read at once)."""
    if artifact is None:
        return Shown()
    preview = preview_kind(artifact)
    if preview == "render":
        # A widget is shown only as its PNG preview, and only when one was
        # rendered (recorded in the widget's own meta: no extra query).
        state = preview_status(artifact)
        if state.get("status") != "ok":
            return Shown("no-preview", str(state.get("reason") or ""))
        return Shown(preview)
    if preview != "excerpt":
        return Shown(preview)
    excerpt, truncated, missing = output_excerpt(artifact, heads)
    if missing:
        return Shown("missing")
    if _is_data(artifact.media_type):
        # Data for programs is not shown as code: a saved search as its
        # headlines, anything else as words (its text under the engineer's fold).
        headlines = search_headlines(
            sha256=artifact.sha256, media_type=artifact.media_type
        )
        return Shown(
            "headlines" if headlines else "data", excerpt, truncated, headlines
        )
    return Shown(preview, excerpt, truncated)


def _is_data(media_type: str) -> bool:
    media = media_type.split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


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


def current_step_page(*, task: Task) -> int:
    """Return the timeline page that holds the first step not yet done.

    Uses the denormalised ``steps_done``: steps run in order, so the current
    step is step ``steps_done + 1``.
    """
    return min(task.steps_done, max(task.steps_total - 1, 0)) // STEPS_PER_PAGE + 1


# Settled steps: done, skipped, or never attempted. Such a row changes only
# through a transition, which is logged with the step, so a live update redraws
# a settled row only when an event names its step; the unsettled ones show
# relative times and running bars, and are redrawn on every update.
SETTLED_Q = Q(status__in=Step.Status.finished()) | Q(**NOT_BEGUN)


def task_timeline(
    *, task: Task, page: str | int | None = None
) -> tuple[Page, list[StepRow], TaskClock]:
    """Return one page of the task's steps, with previews and resume advice,
    and the task's clock with every attempt's bar placed on it."""
    steps = Step.objects.filter(task=task).select_related("output").order_by("position")
    paginator = Paginator(steps, STEPS_PER_PAGE)
    step_page = paginator.get_page(page or current_step_page(task=task))
    clock = task_clock(task=task)
    return step_page, _rows(step_page.object_list, task, clock), clock


def task_timeline_changes(
    *, task: Task, page: int, since: int
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
    return _rows(steps, task, clock), clock


def _rows(steps, task: Task, clock: TaskClock) -> list[StepRow]:
    """The rows of ``steps``: their events in one query, their bars, resume
    advice, and their text outputs' first bytes, read in one pass when the
    first row that shows one is drawn (``OutputHeads``)."""
    routes = artifact_routes()
    steps = list(steps)
    heads = OutputHeads(
        [
            step.output.sha256
            for step in steps
            if step.output is not None and preview_kind(step.output) == "excerpt"
        ]
    )
    rows = []
    for step in steps:
        step.task = task  # the page already holds it; resume advice reads it
        rows.append(StepRow(step=step, routes=routes, heads=heads))
    _attempts(rows)
    _place_bars(clock, rows)
    _advise(rows, task)
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
                f" unfinished. {rule_words(rule) or str(data.get('words') or '')}"
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


def _place_bars(clock: TaskClock, rows: list[StepRow]) -> None:
    """Place every attempt's bar on the clock, in ms from the task's first call."""
    if clock.started_at is None:
        return
    for row in rows:
        attempts = row.attempts
        task = getattr(row.step, "task", None)
        for i, attempt in enumerate(attempts):
            end = attempt.ended_at
            in_flight = (
                end is None
                and i + 1 == len(attempts)
                and attempt.outcome == "running"
                and row.step.status == Step.Status.RUNNING
                and task is not None
                and task.lease_live
            )
            if in_flight:
                end = clock.ended_at  # a call in flight runs until now
            elif end is None:
                # Its worker stopped mid-call: how long it ran is not known,
                # and the wait for a person after it is not work. A mark
                # where it began (drawn at least a stroke wide).
                if attempt.outcome == "running":
                    attempt.outcome = "interrupted"
                end = attempt.started_at
            attempt.bar_x = max(0, milliseconds(attempt.started_at - clock.started_at))
            attempt.bar_w = max(1, milliseconds(end - attempt.started_at))
