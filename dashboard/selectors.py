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
from dataclasses import dataclass, field
from functools import cache, cached_property
from operator import attrgetter
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import (
    Count,
    Exists,
    Func,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Greatest
from django.http import Http404
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils import timezone

from artifacts.models import Artifact
from artifacts.preview import preview_status
from artifacts.store import BlobError, default_store
from council.models import CouncilRound, Turn
from pippa_site.hotsql import value_from_db
from pippa_site.owners import sees_every_row
from tasks.actions import ATTENTION_STEPS, Choice, step_decision
from tasks.models import (
    Conversation,
    Event,
    Step,
    Task,
    lease_dead_q,
    needs_you_q,
    needs_you_sql,
)
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

    The rule's list (``needs_you_sql``, from the partial index
    tasks_step_attention's few rows) is read once a statement; each row's
    count only checks its steps' ids against it.
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


def _needs_you_exists() -> Exists:
    """Whether a conversation has a step waiting for a person."""
    return Exists(Step.objects.filter(needs_you_q(), task__conversation=OuterRef("pk")))


def _conversations_shown(
    *, user, query: str, needs_you: bool
) -> QuerySet[Conversation]:
    """The conversations ``user`` may see that match ``query`` (a title of the
    conversation or of one of its tasks) and, with ``needs_you``, that have a
    step waiting for a person. No annotations: the list's rows, and its count."""
    conversations = Conversation.objects.for_user(user, staff=True)
    query = query.strip()
    if query:
        task_match = Task.objects.filter(
            conversation=OuterRef("pk"), title__icontains=query
        )
        conversations = conversations.filter(
            Q(title__icontains=query) | Exists(task_match)
        )
    if needs_you:
        conversations = conversations.filter(_needs_you_exists())
    return conversations


def conversation_list(
    *, user, query: str = "", needs_you: bool = False, none_need_you: bool = False
) -> QuerySet[Conversation]:
    """Return the conversations ``user`` may see, newest activity first.

    Each row carries its tasks' totals as annotations (one grouped query), so
    the list never loads task rows one conversation at a time. "Activity" is
    the latest change of the conversation or any of its tasks. ``needs_you``
    keeps only conversations with a step waiting for a person;
    ``none_need_you`` says that none has one (the page's ``Totals``), so each
    row's count is 0 without asking.
    """
    needs_you_count = Value(0) if none_need_you else _needs_you_count("conversation")
    return (
        _conversations_shown(user=user, query=query, needs_you=needs_you)
        .select_related("owner")
        .annotate(
            task_count=Count("tasks"),
            active_count=Count("tasks", filter=Q(tasks__status__in=ACTIVE)),
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
            needs_you_count=needs_you_count,
            activity_at=Greatest(
                "updated_at", Coalesce(Max("tasks__updated_at"), "updated_at")
            ),
        )
        .order_by("-activity_at", "-pk")
    )


class CountedPaginator(Paginator):
    """A paginator that counts a plainer queryset of the same rows.

    Counting the annotated list would run its grouped join and every
    subquery over all the user's conversations just to learn how many there
    are (9 ms of a 1,000-conversation page, against 0.3 ms for the plain count).
    """

    def __init__(self, object_list, per_page, *, counted: QuerySet | int) -> None:
        super().__init__(object_list, per_page)
        self.counted = counted  # or the count itself, when the caller knows it

    @cached_property
    def count(self) -> int:
        if isinstance(self.counted, int):
            return self.counted
        return self.counted.count()


def conversation_page(
    *,
    user,
    query: str = "",
    page: str | int | None = 1,
    needs_you: bool = False,
    totals: Totals | None = None,
) -> Page:
    """One page of ``conversation_list``. With the page's ``totals``, the
    unfiltered list takes its count from them instead of counting again, and
    the rows ask no needs-you count when nothing needs the user; a filtered
    first page that is not full is its own count."""
    rows = conversation_list(
        user=user,
        query=query,
        needs_you=needs_you,
        none_need_you=totals is not None and not totals.needing_you,
    )
    if totals is not None and not query.strip() and not needs_you:
        counted = totals.conversations
    else:
        counted = _conversations_shown(user=user, query=query, needs_you=needs_you)
        if page in (None, "", 1, "1"):
            rows = list(rows[:CONVERSATIONS_PER_PAGE])  # the first page's rows
            if len(rows) < CONVERSATIONS_PER_PAGE:
                counted = len(rows)
    paginator = CountedPaginator(rows, CONVERSATIONS_PER_PAGE, counted=counted)
    return paginator.get_page(page)


# How many decisions the home page lists; the count says when there are more.
TODO_LIMIT = 50


@dataclass
class ToDo:
    """What waits for a person: steps to decide, and paused tasks to resume."""

    decisions: list[Step]
    paused: list[Task]
    working: int  # tasks a worker is on or will be (queued, running)
    more: bool = False  # past TODO_LIMIT

    @property
    def count(self) -> int:
        return len(self.decisions) + len(self.paused)

    @property
    def first_url(self) -> str:
        return todo_url(self.decisions[0]) if self.decisions else ""


def todo_url(step: Step) -> str:
    """Where a decision's card is: its task page, at the card."""
    return f"{step.task.get_absolute_url()}#attention-{step.position}"


def _lease_live_q(prefix: str = "") -> Q:
    return ~lease_dead_q(prefix)


def todo_for_user(
    *, user, exclude_task: Task | None = None, totals: Totals | None = None
) -> ToDo:
    """Return what waits for ``user`` (their own conversations), oldest first.

    A step waits when it needs a person (``needs_you_q``: a step in flight
    under a pause is not a decision while its worker's lease is live). A
    paused task waits when nothing in it needs a decision: only a resume.
    Three queries, each on the partial index of attention steps or on the
    owner's tasks. With the home page's ``totals`` none when nothing can wait
    (``Totals.waiting``), else two: the totals know the working figure.
    """
    if totals is not None and not totals.waiting:
        return ToDo(decisions=[], paused=[], working=totals.working)
    steps = (
        Step.objects.for_user(user)
        .filter(needs_you_q())
        .select_related("task", "task__conversation")
        .order_by("task__created_at", "task_id", "position")
    )
    if exclude_task is not None:
        steps = steps.exclude(task=exclude_task)
    decisions = list(steps[: TODO_LIMIT + 1])
    paused = list(
        Task.objects.for_user(user)
        .filter(status=Task.Status.PAUSED)
        .exclude(_lease_live_q())
        .exclude(Exists(Step.objects.filter(needs_you_q(), task=OuterRef("pk"))))
        .select_related("conversation")
        .order_by("updated_at", "pk")[: TODO_LIMIT + 1]
    )
    more = len(decisions) + len(paused) > TODO_LIMIT
    decisions = decisions[:TODO_LIMIT]
    paused = paused[: max(0, TODO_LIMIT - len(decisions))]
    if totals is not None:
        working = totals.working
    else:
        working = Task.objects.for_user(user).filter(status__in=ACTIVE).count()
    return ToDo(decisions=decisions, paused=paused, working=working, more=more)


def next_decision_for_user(*, user, after: Task) -> Step | None:
    """The first decision waiting for ``user`` outside ``after``: "Next decision →".

    Asked at every task page and live update, so it is one statement around
    the rule's own SQL (``needs_you_sql``), not a query the ORM builds and
    compiles each time (that was 1.3 ms of a 20 ms request, the database's
    part 0.07). The step comes back with what the link shows: its position,
    its task's id and title.
    """
    needs, params = needs_you_sql()
    sql = (
        f"SELECT s.id, s.position, t.id, t.title FROM {Step._meta.db_table} s"
        f" JOIN {Task._meta.db_table} t ON t.id = s.task_id"
        f" JOIN {Conversation._meta.db_table} c ON c.id = t.conversation_id"
        f" WHERE s.id IN ({needs}) AND c.owner_id = %s AND t.id <> %s"
        " ORDER BY t.created_at, t.id, s.position LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, user.pk, after.pk])
        row = cursor.fetchone()
    if row is None:
        return None
    step_id, position, task_id, title = row
    step = Step(id=step_id, position=position, task_id=task_id)
    step.task = Task(id=task_id, title=title)
    return step


# How long a page's counts are kept for its version (``Totals``): a guard, not
# the rule. The version changes with everything the counts read.
TOTALS_CACHE_SECONDS = 60


class Totals:
    """What ``user``'s home page (or one conversation's page, which reads only
    its version) knows of itself: the fingerprint a refresh compares, and the
    counts the home page shows, so that it does not count them again.

    The version and the number of conversations come from one aggregate query
    (``dashboard_totals``). The to-do counts are read only when a page shows
    them (a refresh answered 204 never does), once a version: the version
    changes with everything they read, so a page drawn again at the same
    version (a search, the next page, a reload) takes them from the cache.
    """

    def __init__(self, *, user, version: str, conversations: int) -> None:
        self.user = user
        self.version = version  # changes when anything the page shows changes
        self.conversations = conversations  # the conversations the page may list

    @cached_property
    def _counts(self) -> dict[str, int]:
        staff = sees_every_row(self.user, staff=True)
        key = f"pippa:totals:{self.user.pk}:{int(staff)}:{self.version}"
        return caches["default"].get_or_set(key, self._count_now, TOTALS_CACHE_SECONDS)

    def _count_now(self) -> dict[str, int]:
        # The needs-you count starts from the few steps of the partial index
        # of attention steps, not from a question put to each conversation.
        needing_you = Step.objects.for_user(self.user, staff=True).filter(needs_you_q())
        mine = Q(owner=self.user)
        return Conversation.objects.for_user(self.user, staff=True).aggregate(
            needing_you=_count(needing_you, "task__conversation", distinct=True),
            working=Count("tasks", filter=mine & Q(tasks__status__in=ACTIVE)),
            paused=Count("tasks", filter=mine & Q(tasks__status=Task.Status.PAUSED)),
        )

    @property
    def working(self) -> int:
        """The user's own tasks queued or running (``ToDo.working``)."""
        return self._counts["working"] or 0

    @property
    def needing_you(self) -> int:
        """Conversations with a step waiting for a person."""
        return self._counts["needing_you"] or 0

    @property
    def waiting(self) -> int:
        """0 only when the to-do list is empty: ``needing_you`` (a decision of
        the user's own waits in a conversation they see) plus the user's
        paused tasks. Not the list's length (a conversation may hold several
        decisions, and a paused task with a decision in it is not listed as a
        resume)."""
        return self.needing_you + (self._counts["paused"] or 0)


def _count(rows: QuerySet, field: str = "pk", *, distinct: bool = False) -> Max:
    """How many ``rows`` (of distinct ``field`` values), as a scalar subquery
    that names no outer column: the database reads it once however many rows
    the outer query has (``MAX`` of the one value on every row)."""
    counted = "DISTINCT %(expressions)s" if distinct else "%(expressions)s"
    n = Func(field, function="COUNT", template=f"%(function)s({counted})")
    return Max(Subquery(rows.order_by().values(n=n)))


def dashboard_totals(*, user, conversation: Conversation | None = None) -> Totals:
    """The ``Totals`` of ``user``'s home page, or of one conversation's page.

    The version changes when any of their tasks logs an event, a task or a
    conversation comes or goes, a council round gets a turn, or a worker's
    lease runs out (which writes nothing, and can put a decision on the to-do
    list); a page's refresh sends it back, and the same answer is a 204. One
    query (the council's turns are a subquery the database reads once,
    ``_count``); the to-do counts are read later, if the page shows them.
    """
    if conversation is None:
        conversations = Conversation.objects.for_user(user, staff=True)
    else:
        conversations = Conversation.objects.filter(pk=conversation.pk)
    # One join (conversation to its tasks): a task row comes once, so only the
    # conversations are counted distinct.
    totals = conversations.aggregate(
        v_n=Count("pk", distinct=True),
        v_changed=Max("updated_at"),
        v_tasks=Count("tasks"),
        v_seqs=Coalesce(Sum("tasks__last_seq"), 0),
        v_task_changed=Max("tasks__updated_at"),
        v_rounds=_count(Turn.objects.filter(round__conversation__in=conversations)),
        # A worker that stops answering writes nothing, but its lease runs
        # out: a step it held becomes a decision, so the page must change.
        v_leases=Count("tasks", filter=_lease_live_q("tasks__")),
    )
    stamp = max(
        (t.timestamp() for t in (totals["v_changed"], totals["v_task_changed"]) if t),
        default=0,
    )
    return Totals(
        user=user,
        version=(
            f"{totals['v_n']}.{totals['v_tasks']}.{totals['v_seqs']}."
            f"{totals['v_rounds'] or 0}.{totals['v_leases']}.{stamp:.6f}"
        ),
        conversations=totals["v_n"],
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


def task_poll_state_for_user(*, user, task_id: int) -> tuple[int, bool]:
    """Return (last event seq, whether a worker holds a live lease) of a task
    ``user`` may see, or raise Http404 like ``task_get_for_user``.

    A live poll compares both with what its page shows: every change of a task
    appends an event, except a worker that stops answering (its lease runs out
    without a word), which the lease's state tells. One indexed row.
    """
    q = connection.ops.quote_name
    everyone = sees_every_row(user, staff=True)
    sql = (
        "SELECT t.last_seq, t.lease_owner <> '' AND t.lease_expires_at >= %s"
        f" FROM {q(Task._meta.db_table)} t"
        f" JOIN {q(Conversation._meta.db_table)} c ON c.id = t.conversation_id"
        " WHERE t.id = %s" + ("" if everyone else " AND c.owner_id = %s")
    )
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    params = [now, int(task_id)] + ([] if everyone else [user.pk])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise Http404("No Task matches the given query.")
    return row[0], bool(row[1])


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
    return (
        Task.objects.exclude(pk=task.pk)
        .exclude(lease_owner="")
        .filter(lease_expires_at__gte=timezone.now())
        .exists()
    )


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
    # "image" (raster), "svg" (drawn in an <img>, where no script runs),
    # "headlines" (a saved search), "excerpt", "" (shown only as a download)
    preview: str = ""
    excerpt: str = ""
    excerpt_truncated: bool = False
    headlines: list[dict] = field(default_factory=list)


# An artifact id no row has: reversed once, it splits each route in two.
_ANY_ARTIFACT = 987654321987


@cache
def _artifact_routes(
    prefix: str, urlconf: str | None, root: str
) -> dict[str, tuple[str, str]]:
    """Each artifact page's URL before and after its id, for one script
    ``prefix`` and URLconf (``urlconf``, else ``root``)."""
    parts = {}
    for name in ("detail", "source", "preview"):
        url = reverse(f"artifacts:{name}", args=[_ANY_ARTIFACT], urlconf=urlconf)
        head, _, tail = url.partition(str(_ANY_ARTIFACT))
        parts[name] = (head, tail)
    return parts


def artifact_routes() -> dict[str, tuple[str, str]]:
    """The artifact pages' routes for this request's script prefix and URLconf.

    Read once per list of rows: each read of the prefix and the URLconf is an
    ``asgiref`` ``Local`` behind one lock that every server thread shares.
    """
    return _artifact_routes(get_script_prefix(), get_urlconf(), settings.ROOT_URLCONF)


def artifact_url(name: str, artifact_id: int, routes=None) -> str:
    """``{% url 'artifacts:<name>' artifact_id %}`` without reversing a route
    per row: the route's two halves are reversed once per script prefix."""
    head, tail = (routes or artifact_routes())[name]
    return f"{head}{artifact_id}{tail}"


# What a row shows that is read from beyond its step's own row: its output's
# preview (a file's first bytes) and its attempts and notes (the step's
# events). A row that may be kept (``may_keep``) gets them only when it is
# drawn (``rows_complete``); one the rows cache serves never reads them.
LATER = frozenset({"preview", "excerpt", "excerpt_truncated", "attempts", "notes"})


@dataclass(eq=False)
class StepRow:
    """One timeline row: the step and what the page shows of its output.

    ``preview`` ("", "image", "render", "no-preview", "excerpt", "binary",
    "missing"), ``excerpt``, ``excerpt_truncated``, ``attempts`` and
    ``notes`` (the ``LATER`` names) are read by ``rows_complete``: a row
    that may be kept gets them when something first asks (its list's
    ``_Later``), so a row the rows cache serves never reads its file or its
    events.
    """

    step: Step
    advice: Any = None  # tasks.resume.ResumeAdvice
    resolve_options: list[str] = field(default_factory=list)
    saved: SavedOutput | None = None
    choices: list[Choice] = field(default_factory=list)
    plain_words: str = ""  # what resume will do, in Dad's words
    routes: dict | None = None  # artifact_routes(), once for the list
    # The rows of its list not read yet; None once this one is.
    later: _Later | None = None
    # Whether the output's file is there (a text output of a row that may
    # be kept, whose excerpt is not read yet; else None).
    on_disk: bool | None = None

    def __getattr__(self, name: str):
        # Only for a name the row does not hold yet: a LATER one, read then.
        later = self.__dict__.get("later")
        if name in LATER and later is not None:
            later.complete()
            return self.__dict__[name]
        raise AttributeError(name)

    @property
    def needs_attention(self) -> bool:
        return self.step.status in ATTENTION_STEPS

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
    def failed_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome in ("failed", "interrupted")]

    @property
    def shows_attempts(self) -> bool:
        """Whether the row unfolds its attempts and notes, each with its time
        in words relative to now ("5 min ago"): such a row is never kept in
        the rows cache (``dashboard.rowcache``)."""
        return len(self.attempts) > 1 or bool(self.failed_attempts or self.notes)

    def sources(self) -> tuple:
        """Everything the row is made from besides the page and the code:
        every column of its step and of its output, the step's last event
        (events are appended, never changed), and whether the output's file
        is there. The rows cache's key (``dashboard.rowcache``)."""
        step = self.step
        output = step.output
        return (
            _columns(Step)(step),
            step.last_event,
            None if output is None else _columns(Artifact)(output),
            self.on_disk,
        )


@cache
def _columns(model):
    """A function of a ``model`` instance giving every concrete column's value."""
    return attrgetter(*(f.attname for f in model._meta.concrete_fields))


class _Later:
    """The rows of one read that may be kept, not read yet: read at once
    (one query for their events, one pass over their files) when any of
    them is asked for a ``LATER`` name."""

    def __init__(self, clock: TaskClock, rows: list[StepRow]):
        self.clock = clock
        self.rows = rows

    def complete(self, rows: list[StepRow] | None = None) -> None:
        todo = [r for r in (self.rows if rows is None else rows) if r.later is self]
        if todo:
            _read_later(todo, self.clock)
        if rows is None:
            self.rows = []


def may_keep(step: Step) -> bool:
    """Whether a step's row may be kept, by its columns alone (``SETTLED_Q``
    in Python): a finished step's (done or skipped), and a pending step's
    that was never tried (a task's later steps, most of a running task's
    page); not a running or waiting step's ("started 9 s ago", "next attempt
    in 20 s"). ``dashboard.rowcache.settled`` asks the rest (it unfolds no
    attempts or notes) once the row is read."""
    if step.status in Step.Status.finished():
        return True
    return (
        step.status == Step.Status.PENDING
        and not step.attempts
        and step.next_attempt_at is None
    )


def rows_complete(rows: list[StepRow]) -> None:
    """Read the ``LATER`` names of those of ``rows`` not read yet, at once."""
    by_later: dict[int, tuple[_Later, list[StepRow]]] = {}
    for row in rows:
        later = row.__dict__.get("later")
        if later is not None:
            by_later.setdefault(id(later), (later, []))[1].append(row)
    for later, todo in by_later.values():
        later.complete(todo)


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


def _fill(row: StepRow, heads: dict) -> None:
    """Set what ``row`` shows of its output (``heads``: its list's text
    outputs' first bytes, read at once), and no attempts or notes yet."""
    row.preview, row.excerpt, row.excerpt_truncated = "", "", False
    row.attempts, row.notes = [], []
    artifact = row.step.output
    if artifact is None:
        return
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
        row.on_disk = not missing  # as read now (a stat may have said otherwise)
        if missing:
            row.preview = "missing"


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
    elif media.split(";")[0].strip().lower() == "image/svg+xml":
        saved.preview = "svg"
    elif kind == "excerpt":
        text, saved.excerpt_truncated, missing = _blob_excerpt(saved.sha)
        if not missing:
            saved.preview, saved.excerpt = "excerpt", text
            saved.headlines = _headlines(saved.sha, media)
            if saved.headlines:
                saved.preview = "headlines"
    return saved


MAX_HEADLINES = 10


def _headlines(sha: str, media: str) -> list[dict]:
    """A saved search's results as (title, url) pairs, when it is one.

    A JSON object with a ``results`` list of objects that have a ``title``
    (the shape of a search tool's answer); anything else is shown as text.
    """
    if "json" not in media:
        return []
    try:
        with default_store().open(sha) as fh:
            data = json.loads(fh.read(256 * 1024))
    except (BlobError, OSError, ValueError):
        return []
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        return []
    return [
        {"title": str(r["title"])[:200], "url": str(r.get("url") or "")[:500]}
        for r in results[:MAX_HEADLINES]
        if isinstance(r, dict) and r.get("title")
    ]


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
SETTLED_Q = Q(status__in=Step.Status.finished()) | Q(
    status=Step.Status.PENDING, attempts=0, next_attempt_at__isnull=True
)

# Each step's last event (index tasks_event_step_seq): part of a row's
# sources, since its attempts and notes are folded from its events.
LAST_EVENT = Subquery(
    Event.objects.filter(step=OuterRef("pk")).order_by("-seq").values("seq")[:1]
)


def task_timeline(
    *, task: Task, page: str | int | None = None
) -> tuple[Page, list[StepRow], TaskClock]:
    """Return one page of the task's steps, with previews and resume advice,
    and the task's clock with every attempt's bar placed on it."""
    steps = (
        Step.objects.filter(task=task)
        .select_related("output")
        .annotate(last_event=LAST_EVENT)
        .order_by("position")
    )
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
        .annotate(last_event=LAST_EVENT)
        .order_by("position")
    )
    clock = task_clock(task=task)
    return _rows(steps, task, clock), clock


def _rows(steps, task: Task, clock: TaskClock) -> list[StepRow]:
    """The rows of ``steps``: read whole, except those that may be kept,
    whose ``LATER`` names wait until they are drawn (``rows_complete``)."""
    routes = artifact_routes()
    rows, kept = [], []
    for step in steps:
        step.task = task  # the page already holds it; resume advice reads it
        row = StepRow(step=step, routes=routes)
        rows.append(row)
        if may_keep(step):
            kept.append(row)
    if kept:
        later = _Later(clock, kept)
        texts = {}
        for row in kept:
            row.later = later
            output = row.step.output
            if output is not None and _preview_kind(output) == "excerpt":
                texts[row] = output.sha256
        # Whether each text output's file is there: a stat each, no read.
        there = default_store().states(texts.values(), verify=False)
        for row, sha in texts.items():
            row.on_disk = sha in there
    _read_later([row for row in rows if row.later is None], clock)
    _advise(rows, task)
    return rows


def _read_later(rows: list[StepRow], clock: TaskClock) -> None:
    """Read the ``LATER`` names of ``rows``: their text outputs' first
    bytes in one pass, their events in one query, their bars."""
    if not rows:
        return
    heads = default_store().heads(
        [
            row.step.output.sha256
            for row in rows
            if row.step.output is not None
            and _preview_kind(row.step.output) == "excerpt"
        ],
        EXCERPT_BYTES + 1,
    )
    for row in rows:
        _fill(row, heads)
        row.later = None
    _attempts(rows)
    _place_bars(clock, rows)


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
CLOCK_SQL = """
WITH span AS (
    SELECT MIN(started_at) AS first, MAX(finished_at) AS last
    FROM tasks_step WHERE task_id = %(task)s AND position > %(low)s
)
SELECT NULL, NULL, first, last FROM span
UNION ALL
SELECT e.seq, e.kind, e.created_at, NULL FROM tasks_event e, span
WHERE e.task_id = %(task)s AND e.kind IN (%(paused)s, %(queued)s)
    AND e.created_at >= span.first
"""


def task_clock(*, task: Task) -> TaskClock:
    """Return the task's span: from its own first call (a branch's kept steps
    ran in its parent's time) to its end (or now, while it runs), and the
    time it spent paused within it. One statement (``CLOCK_SQL``)."""
    branched = task.branched_from_id and task.branched_at
    with connection.cursor() as cursor:
        cursor.execute(
            CLOCK_SQL,
            {
                "task": task.pk,
                "low": task.branched_at if branched else -1,
                "paused": Event.Kind.TASK_PAUSED.value,
                "queued": Event.Kind.TASK_QUEUED.value,
            },
        )
        rows = cursor.fetchall()
    marks = []
    for seq, kind, at, last in rows:
        if seq is None:  # the span's row: its steps' times
            first = value_from_db(Step, "started_at", at)
            last = value_from_db(Step, "finished_at", last)
        else:  # a mark: its event's time
            marks.append((seq, kind, value_from_db(Event, "created_at", at)))
    clock = TaskClock(started_at=first)
    if clock.started_at is None:
        return clock
    if task.is_idle:
        clock.ended_at = task.finished_at or last or timezone.now()
    else:
        clock.ended_at = timezone.now()
    clock.ended_at = max(clock.ended_at, clock.started_at)
    clock.paused = _paused_within(sorted(marks), clock.ended_at)
    return clock


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
    return json.dumps(resume_context(task), indent=2, default=str, sort_keys=False)
