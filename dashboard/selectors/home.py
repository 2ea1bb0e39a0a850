"""The home and conversation pages: conversations, totals, the to-do list.

The conversation page reads task rows only (their denormalised
``steps_total``/``steps_done``), never step or event rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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

from council.models import CouncilRound, Turn
from pippa_site.owners import sees_every_row
from tasks.models import (
    Conversation,
    Step,
    Task,
    lease_dead_q,
    needs_you_q,
    needs_you_sql,
)

CONVERSATIONS_PER_PAGE = 50
ACTIVE = (Task.Status.QUEUED, Task.Status.RUNNING)


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
    *, user, staff: bool, query: str, needs_you: bool
) -> QuerySet[Conversation]:
    """The conversations ``user`` may see that match ``query`` (a title of the
    conversation or of one of its tasks) and, with ``needs_you``, that have a
    step waiting for a person. No annotations: the list's rows, and its count."""
    conversations = Conversation.objects.for_user(user, staff=staff)
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
    *,
    user,
    staff: bool = False,
    query: str = "",
    needs_you: bool = False,
    none_need_you: bool = False,
) -> QuerySet[Conversation]:
    """Return the conversations ``user`` may see (every one to staff with
    ``staff``, ``pippa_site.owners``), newest activity first.

    Each row carries its tasks' totals as annotations (one grouped query), so
    the list never loads task rows one conversation at a time. "Activity" is
    the latest change of the conversation or any of its tasks. ``needs_you``
    keeps only conversations with a step waiting for a person;
    ``none_need_you`` says that none has one (the page's ``Totals``), so each
    row's count is 0 without asking.
    """
    needs_you_count = Value(0) if none_need_you else _needs_you_count("conversation")
    # Paused tasks that wait only for a resume: one with a decision counts
    # among the decisions (as on the to-do list), not twice.
    paused_only = Q(tasks__status=Task.Status.PAUSED)
    if not none_need_you:
        paused_only &= ~Q(
            tasks__pk__in=Step.objects.filter(needs_you_q()).values("task_id")
        )
    return (
        _conversations_shown(user=user, staff=staff, query=query, needs_you=needs_you)
        .select_related("owner")
        .annotate(
            task_count=Count("tasks"),
            active_count=Count("tasks", filter=Q(tasks__status__in=ACTIVE)),
            done_count=Count("tasks", filter=Q(tasks__status=Task.Status.DONE)),
            paused_count=Count("tasks", filter=paused_only),
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
            activity_at=_activity_at(),
        )
        .order_by(*ACTIVITY_ORDER)
    )


# Newest activity first: the latest change of the conversation or any of its tasks.
ACTIVITY_ORDER = ("-activity_at", "-pk")


def _activity_at() -> Greatest:
    return Greatest("updated_at", Coalesce(Max("tasks__updated_at"), "updated_at"))


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
    staff: bool = False,
    query: str = "",
    page: str | int | None = 1,
    needs_you: bool = False,
    totals: Totals | None = None,
) -> Page:
    """One page of ``conversation_list``. With the page's ``totals``, the
    unfiltered list takes its count from them instead of counting again, and
    the rows ask no needs-you count when nothing needs the user; a filtered
    first page that is not full is its own count."""
    shown = _conversations_shown(
        user=user, staff=staff, query=query, needs_you=needs_you
    )
    # The page's place in the order first, then the totals of its rows alone:
    # asked of every conversation, the list's subqueries cost a 1,000-row list
    # 12.6 ms, against 8.1 ms this way.
    ordered = (
        shown.annotate(activity_at=_activity_at())
        .order_by(*ACTIVITY_ORDER)
        .values_list("pk", flat=True)
    )
    if totals is not None and not query.strip() and not needs_you:
        counted = totals.conversations
    else:
        counted = shown
        if page in (None, "", 1, "1"):
            ordered = list(ordered[:CONVERSATIONS_PER_PAGE])  # the first page's
            if len(ordered) < CONVERSATIONS_PER_PAGE:
                counted = len(ordered)
    paginator = CountedPaginator(ordered, CONVERSATIONS_PER_PAGE, counted=counted)
    found = paginator.get_page(page)
    ids = list(found.object_list)
    rows = conversation_list(
        user=user,
        staff=staff,
        query=query,
        needs_you=needs_you,
        none_need_you=totals is not None and not totals.needing_you,
    ).in_bulk(ids)
    # In the order read (a conversation deleted meanwhile is left out).
    found.object_list = [rows[pk] for pk in ids if pk in rows]
    return found


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
        """Everything on the list: decisions and paused tasks (the tab's count)."""
        return len(self.decisions) + len(self.paused)


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

    def __init__(self, *, user, staff: bool, version: str, conversations: int) -> None:
        self.user = user
        self.staff = sees_every_row(user, staff=staff)  # the page shows every row
        self.version = version  # changes when anything the page shows changes
        self.conversations = conversations  # the conversations the page may list

    @cached_property
    def _counts(self) -> dict[str, int]:
        key = f"pippa:totals:{self.user.pk}:{int(self.staff)}:{self.version}"
        return caches["default"].get_or_set(key, self._count_now, TOTALS_CACHE_SECONDS)

    def _count_now(self) -> dict[str, int]:
        # The needs-you count starts from the few steps of the partial index
        # of attention steps, not from a question put to each conversation.
        needing_you = Step.objects.for_user(self.user, staff=self.staff).filter(
            needs_you_q()
        )
        mine = Q(owner=self.user)
        return Conversation.objects.for_user(self.user, staff=self.staff).aggregate(
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


def dashboard_totals(
    *, user, staff: bool = False, conversation: Conversation | None = None
) -> Totals:
    """The ``Totals`` of ``user``'s home page, or of one conversation's page.

    The version changes when any of their tasks logs an event, a task or a
    conversation comes or goes, a council round gets a turn, or a worker's
    lease runs out (which writes nothing, and can put a decision on the to-do
    list); a page's refresh sends it back, and the same answer is a 204. One
    query (the council's turns are a subquery the database reads once,
    ``_count``); the to-do counts are read later, if the page shows them.
    """
    if conversation is None:
        conversations = Conversation.objects.for_user(user, staff=staff)
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
        staff=staff,
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
        .annotate(
            needs_you_count=_needs_you_count("task"),
            # A finished task whose steps were skipped made nothing: its row
            # says so rather than "done".
            skipped_count=Coalesce(
                Subquery(
                    Step.objects.filter(task=OuterRef("pk"), status=Step.Status.SKIPPED)
                    .order_by()
                    .values("task")
                    .annotate(n=Count("pk"))
                    .values("n")[:1]
                ),
                0,
            ),
        )
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
