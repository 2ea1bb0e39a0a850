"""Dashboard selectors and display filters: visibility, paging, and plain wording."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.selectors.clock import task_clock
from dashboard.selectors.events import EVENTS_PER_PAGE, task_events
from dashboard.selectors.home import (
    CONVERSATIONS_PER_PAGE,
    TODO_LIMIT,
    conversation_list,
    conversation_page,
    dashboard_totals,
    next_decision_for_user,
    todo_for_user,
)
from dashboard.selectors.timeline import (
    STEPS_PER_PAGE,
    current_step_page,
    step_in_flight,
    task_timeline,
)
from dashboard.templatetags.pippa import duration, from_now
from dashboard.templatetags.pippa_words import (
    MAX_SUMMARY_CHARS,
    json_long,
    json_summary,
)
from tasks.models import Conversation, Event, Step, Task
from tests.tasks.dashboard_data import add_events, add_steps

pytestmark = pytest.mark.django_db


def test_conversation_list_counts_tasks_by_state_in_one_query(
    user, make_conversation, make_task, django_assert_num_queries
):
    conversation = make_conversation(owner=user)
    for status in ("running", "queued", "failed", "needs_review", "done", "paused"):
        task = make_task(conversation=conversation, status=status)
        add_steps(task, 2, done=1)
    with django_assert_num_queries(1):
        row = conversation_list(user=user).get()
    assert row.task_count == 6
    assert row.active_count == 2
    assert row.done_count == 1
    assert row.paused_count == 1
    assert (row.steps_done_sum, row.steps_total_sum) == (6, 12)


def test_conversation_list_of_a_user_hides_other_users_and_staff_see_all(
    user, make_user, make_conversation
):
    make_conversation(owner=user, title="mine")
    make_conversation(title="theirs")
    boss = make_user(username="boss", is_staff=True)
    assert [c.title for c in conversation_list(user=user)] == ["mine"]
    assert conversation_list(user=boss, staff=True).count() == 2
    # Only where a page opts in: elsewhere staff see their own rows only.
    assert conversation_list(user=boss).count() == 0


def test_search_matches_a_task_title_without_duplicating_the_conversation(
    user, make_conversation, make_task
):
    conversation = make_conversation(owner=user, title="Misc")
    make_task(conversation=conversation, title="tomato one")
    make_task(conversation=conversation, title="tomato two")
    found = list(conversation_list(user=user, query="tomato"))
    assert [c.pk for c in found] == [conversation.pk]
    assert found[0].task_count == 2


def test_the_current_step_page_follows_the_done_count(make_task):
    per_page = STEPS_PER_PAGE
    task = make_task(steps_total=per_page * 2 + per_page // 2, steps_done=0)
    assert current_step_page(task=task) == 1
    task.steps_done = per_page - 1
    assert current_step_page(task=task) == 1
    task.steps_done = per_page
    assert current_step_page(task=task) == 2
    task.steps_done = task.steps_total  # finished: the last page, not an empty one
    assert current_step_page(task=task) == 3


def test_event_keyset_pages_walk_the_whole_log_once(make_task):
    task = make_task()
    add_events(task, EVENTS_PER_PAGE * 2 + 3)
    seen, before = [], None
    while True:
        page = task_events(task=task, before=before)
        seen += [e.seq for e in page.events]
        if page.older_than is None:
            break
        before = page.older_than
    assert seen == list(range(task.last_seq, 0, -1))


def test_a_missing_blob_is_reported_instead_of_breaking_the_timeline(
    user, make_conversation, make_task, blob_store
):
    task = make_task(
        conversation=make_conversation(owner=user), status=Task.Status.DONE
    )
    step = add_steps(task, 1, done=1)[0]
    blob_store.path(step.output.sha256).unlink()
    _, rows, _ = task_timeline(task=task)
    assert rows[0].preview == "missing"


def test_display_filters_speak_plainly():
    assert duration(timedelta(milliseconds=850)) == "850 ms"
    assert duration(timedelta(seconds=12.34)) == "12.3 s"
    assert duration(timedelta(minutes=4, seconds=5)) == "4 min 5 s"
    assert duration(timedelta(hours=2, minutes=3)) == "2 h 3 min"
    now = timezone.now()
    assert from_now(now + timedelta(seconds=45.5)) == "in 45 s"
    assert from_now(now - timedelta(minutes=5, seconds=2)) == "5 min ago"
    assert from_now(now) == "just now"
    assert json_summary({"a": 1}) == '{"a": 1}'
    assert not json_long({"a": 1})
    assert json_summary({"x": "y" * 1000}).endswith("…")
    assert len(json_summary({"x": "y" * 1000})) == MAX_SUMMARY_CHARS
    assert json_long({"x": "y" * 1000})


def test_council_rounds_are_counted_without_inflating_the_task_sums(
    user, make_conversation, make_task
):
    from council.models import CouncilRound

    conversation = make_conversation(owner=user)
    for n in (1, 2, 3):
        CouncilRound.objects.create(conversation=conversation, number=n, topic="t")
    for _ in range(2):
        add_steps(make_task(conversation=conversation), 4, done=1)
    row = conversation_list(user=user).get()
    assert row.round_count == 3
    assert row.task_count == 2
    assert (row.steps_done_sum, row.steps_total_sum) == (2, 8)


def test_a_rows_output_links_are_its_routes_reversed(make_task):
    """StepRow's links reverse each route once, not per row: the same URLs
    as ``{% url %}``, under the script prefix the rows were read under."""
    from django.urls import get_script_prefix, reverse, set_script_prefix

    task = make_task()
    add_steps(task, 2, done=2)
    before = get_script_prefix()
    try:
        for prefix in ("/", "/pippa/"):
            set_script_prefix(prefix)
            _, rows, _ = task_timeline(task=task)
            for row in rows:
                pk = row.step.output_id
                assert row.detail_url == reverse("artifacts:detail", args=[pk])
                assert row.source_url == reverse("artifacts:source", args=[pk])
                assert row.preview_url == reverse("artifacts:preview", args=[pk])
                assert row.detail_url.startswith(prefix)
    finally:
        set_script_prefix(before)


def test_the_list_pages_count_is_its_rows_for_every_filter_and_reads_no_annotation(
    user, make_user, make_conversation, make_task
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for n in range(CONVERSATIONS_PER_PAGE + 5):
        make_task(conversation=make_conversation(owner=user), title=f"plain {n}")
    waiting = make_conversation(owner=user, title="tomato soup")
    add_steps(make_task(conversation=waiting, status="failed"), 1, status="failed")
    add_steps(make_task(conversation=waiting, title="tomato two"), 2, done=1)
    cancelled = make_conversation(owner=user, title="Cancelled")
    add_steps(make_task(conversation=cancelled, status="cancelled"), 1, status="failed")
    theirs = make_conversation(owner=make_user(username="stranger"), title="tomato")
    add_steps(make_task(conversation=theirs, status="failed"), 1, status="failed")

    for query, needs_you, expected in [
        ("", False, CONVERSATIONS_PER_PAGE + 7),
        ("tomato", False, 1),
        ("", True, 1),
        ("tomato", True, 1),
        ("plain 3", True, 0),
    ]:
        page = conversation_page(user=user, query=query, needs_you=needs_you)
        with CaptureQueriesContext(connection) as counted:
            count = page.paginator.count
        rows = list(conversation_list(user=user, query=query, needs_you=needs_you))
        assert count == len(rows) == expected, (query, needs_you)
        assert all(c.owner_id == user.pk for c in rows)
        assert [
            sql["sql"] for sql in counted.captured_queries if "GROUP BY" in sql["sql"]
        ] == []
        if needs_you:
            assert all(c.needs_you_count > 0 for c in rows)


def test_paused_time_runs_from_each_pause_to_the_resume_after_it_in_log_order(
    user, make_conversation, make_task, django_assert_num_queries
):
    start = timezone.now()
    end = start + timedelta(seconds=10)
    task = make_task(
        conversation=make_conversation(owner=user),
        status=Task.Status.DONE,
        finished_at=end,
    )
    # The clock runs from the first call to the task's end: 10 s.
    Step.objects.create(
        task=task, position=1, title="s", tool="t", started_at=start, finished_at=end
    )
    at = {seq: start + timedelta(seconds=s) for seq, s in enumerate(range(-4, 12))}
    marks = {
        1: "task_paused",  # before the window: its resume (2) is outside too
        2: "task_queued",
        5: "task_paused",  # 1 s..3 s
        7: "task_queued",
        9: "task_paused",  # 5 s..6 s, then a second resume that changes nothing
        10: "task_queued",
        11: "task_queued",
        13: "task_paused",  # 9 s, still paused at the window's end (10 s): 1 s
    }
    Event.objects.bulk_create(
        [
            Event(
                task=task, seq=seq, kind=marks.get(seq, "lease_renewed"), created_at=t
            )
            for seq, t in at.items()
            if seq > 0
        ]
    )
    with django_assert_num_queries(2):  # the span, then the marks within it
        clock = task_clock(task=task)
    assert (clock.started_at, clock.ended_at) == (start, end)
    assert clock.paused == timedelta(seconds=4)
    assert clock.worked == timedelta(seconds=6)


def test_the_home_totals_are_one_query_and_agree_with_the_counts_they_stand_for(
    user, make_user, make_conversation, make_task, django_assert_num_queries
):
    from council.models import CouncilRound, Turn

    mine = make_conversation(owner=user, title="mine")
    for status in ("queued", "running", "done", "paused"):
        make_task(conversation=mine, status=status)
    theirs = make_conversation(title="theirs")
    make_task(conversation=theirs, status="running")
    boss = make_user(username="boss", is_staff=True)
    make_task(conversation=make_conversation(owner=boss), status="queued")

    with django_assert_num_queries(1):
        totals = dashboard_totals(user=user)
    # What the unfiltered list counts, and the to-do's own count of working tasks.
    assert totals.conversations == conversation_list(user=user).count() == 1
    assert totals.working == todo_for_user(user=user).working == 2
    # Staff list every conversation, but only their own tasks are their work.
    staff = dashboard_totals(user=boss, staff=True)
    assert staff.conversations == 3
    assert staff.working == todo_for_user(user=boss).working == 1

    # A council turn in one of the user's conversations changes the version;
    # one in another user's conversation does not.
    before = totals.version
    theirs_round = CouncilRound.objects.create(conversation=theirs, number=1, topic="t")
    Turn.objects.create(
        round=theirs_round,
        participant=theirs_round.participants.create(name="grok"),
        order=1,
    )
    assert dashboard_totals(user=user).version == before
    my_round = CouncilRound.objects.create(conversation=mine, number=1, topic="t")
    Turn.objects.create(
        round=my_round, participant=my_round.participants.create(name="kimi"), order=1
    )
    assert dashboard_totals(user=user).version != before


def test_the_unfiltered_list_counts_from_the_totals_and_a_filtered_one_counts_itself(
    user, make_conversation, make_task, django_assert_num_queries
):
    for i in range(CONVERSATIONS_PER_PAGE + 3):
        make_task(conversation=make_conversation(owner=user, title=f"c{i}"))
    make_task(conversation=make_conversation(owner=user, title="tomato"))
    totals = dashboard_totals(user=user)
    assert totals.needing_you == 0  # read once, as the page's to-do reads it
    # The page's place in the order, then its rows' totals; no count.
    with django_assert_num_queries(2):
        page = conversation_page(user=user, totals=totals)
        assert page.paginator.count == CONVERSATIONS_PER_PAGE + 4
        assert page.paginator.num_pages == 2
    found = conversation_page(user=user, query="tomato", totals=totals)
    assert found.paginator.count == 1
    assert [c.title for c in found] == ["tomato"]


def test_a_filtered_first_page_that_is_not_full_is_its_own_count(
    user, make_conversation, make_task, django_assert_num_queries
):
    per_page = CONVERSATIONS_PER_PAGE
    for i in range(per_page + 2):
        make_task(conversation=make_conversation(owner=user, title=f"pear {i}"))
    make_task(conversation=make_conversation(owner=user, title="tomato"))

    with django_assert_num_queries(2):  # the order, the rows; no count
        found = conversation_page(user=user, query="tomato")
        assert (found.paginator.count, found.paginator.num_pages) == (1, 1)
        assert [c.title for c in found] == ["tomato"]
    # A full first page still counts: there may be more.
    with django_assert_num_queries(3):
        full = conversation_page(user=user, query="pear")
        assert (full.paginator.count, full.paginator.num_pages) == (per_page + 2, 2)
        assert len(full) == per_page
        assert full.has_next()
    second = conversation_page(user=user, query="pear", page="2")
    assert len(second) == 2
    assert {c.title for c in full} | {c.title for c in second} == {
        f"pear {i}" for i in range(per_page + 2)
    }
    # Nothing found: an empty first page, counted as none.
    nothing = conversation_page(user=user, query="plum", page="1")
    assert (nothing.paginator.count, list(nothing)) == (0, [])


def test_the_rows_ask_no_needs_you_count_when_the_totals_say_nothing_waits(
    user, make_conversation, make_task
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversation = make_conversation(owner=user, title="mine")
    make_task(conversation=conversation, status="running")

    def row_and_sql() -> tuple[int, str]:
        totals = dashboard_totals(user=user)
        totals.waiting  # noqa: B018 - the page's to-do reads it first
        with CaptureQueriesContext(connection) as ctx:
            (row,) = conversation_page(user=user, totals=totals)
        return row.needs_you_count, ctx.captured_queries[-1]["sql"]

    count, sql = row_and_sql()
    assert count == 0
    assert "tasks_step" not in sql  # no step is read for the rows
    waits = make_task(conversation=conversation, status="needs_review")
    waits.steps.create(position=1, title="a", tool="t", status="needs_review")
    waits.steps.create(position=2, title="b", tool="t", status="failed")
    count, sql = row_and_sql()
    assert count == 2
    assert "tasks_step" in sql


def test_the_to_do_counts_are_read_once_a_version_and_only_when_shown(
    user, make_conversation, make_task, django_assert_num_queries
):
    conversation = make_conversation(owner=user, title="mine")
    make_task(conversation=conversation, status="running")
    with django_assert_num_queries(1):  # the version alone: a refresh's 204
        totals = dashboard_totals(user=user)
    with django_assert_num_queries(1):
        assert (totals.working, totals.needing_you, totals.waiting) == (1, 0, 0)
    # The same version drawn again (a search, a reload): no second count.
    again = dashboard_totals(user=user)
    assert again.version == totals.version
    with django_assert_num_queries(0):
        assert (again.working, again.waiting) == (1, 0)
    # A decision arrives: a new version, counted anew.
    waits = make_task(conversation=conversation, status="needs_review")
    waits.steps.create(position=1, title="a", tool="t", status="needs_review")
    changed = dashboard_totals(user=user)
    assert changed.version != totals.version
    assert (changed.working, changed.needing_you, changed.waiting) == (1, 1, 1)


def test_two_users_with_the_same_version_each_see_their_own_counts(
    user, make_user, make_conversation, make_task
):
    # Task statuses are not in the version (their events are): two users whose
    # pages have the same version can wait on different things.
    other = make_user(username="other")
    at = timezone.now()
    for owner, status in ((user, "paused"), (other, "running")):
        task = make_task(conversation=make_conversation(owner=owner), status=status)
        Conversation.objects.filter(pk=task.conversation_id).update(updated_at=at)
        Task.objects.filter(pk=task.pk).update(updated_at=at)
    mine = dashboard_totals(user=user)
    theirs = dashboard_totals(user=other)
    assert mine.version == theirs.version
    assert (mine.working, mine.waiting) == (0, 1)
    assert (theirs.working, theirs.waiting) == (1, 0)


def test_the_needs_you_count_agrees_with_the_needs_you_list_for_each_user(
    user, make_user, make_conversation, make_task
):
    def waiting(owner, title, task_status="needs_review", step_status="needs_review"):
        task = make_task(
            conversation=make_conversation(owner=owner, title=title), status=task_status
        )
        task.steps.create(position=1, title="a", tool="t", status=step_status)
        task.steps.create(position=2, title="b", tool="t", status=step_status)
        return task

    waiting(user, "two steps wait")
    waiting(user, "interrupted under a pause", "paused", "running")
    waiting(user, "cancelled", "cancelled")
    waiting(user, "still running", "running", "running")
    other = make_user(username="other")
    waiting(other, "theirs")
    boss = make_user(username="boss", is_staff=True)

    for who, expected in ((user, 2), (other, 1), (boss, 3)):
        listed = conversation_list(user=who, staff=True, needs_you=True).count()
        totals = dashboard_totals(user=who, staff=True)
        assert totals.needing_you == listed == expected


def test_the_totals_skip_the_to_do_only_when_nothing_can_wait(
    user, make_user, make_conversation, make_task, django_assert_num_queries
):
    def to_do(who) -> tuple[list, list, int]:
        todo = todo_for_user(user=who)
        return [s.pk for s in todo.decisions], [t.pk for t in todo.paused], todo.working

    def with_totals(who) -> tuple[list, list, int]:
        todo = todo_for_user(user=who, totals=dashboard_totals(user=who))
        return [s.pk for s in todo.decisions], [t.pk for t in todo.paused], todo.working

    other = make_user(username="other")
    boss = make_user(username="boss", is_staff=True)
    mine = make_conversation(owner=user, title="mine")
    make_task(conversation=mine, status="running")
    # Nothing waits: the to-do costs no query, and says so.
    totals = dashboard_totals(user=user)
    assert totals.waiting == 0
    with django_assert_num_queries(0):
        empty = todo_for_user(user=user, totals=totals)
    assert (empty.count, empty.working) == (0, 1)
    assert with_totals(user) == to_do(user)

    # A paused task (a resume), then a decision, then another user's decision
    # that only staff see: the bound never hides what waits, for anyone.
    make_task(conversation=mine, status="paused")
    assert with_totals(user) == to_do(user)
    assert len(to_do(user)[1]) == 1
    decide = make_task(conversation=mine, status="needs_review")
    decide.steps.create(position=1, title="a", tool="t", status="needs_review")
    theirs = make_task(conversation=make_conversation(owner=other), status="failed")
    theirs.steps.create(position=1, title="b", tool="t", status="failed")
    for who in (user, other, boss):
        assert with_totals(who) == to_do(who)
    assert len(to_do(user)[0]) == len(to_do(other)[0]) == 1
    # Staff see the other's conversation need them, but it is not their decision.
    assert dashboard_totals(user=boss, staff=True).waiting == 2
    assert to_do(boss) == ([], [], 0)


def test_a_step_in_flight_under_a_pause_needs_you_nowhere_until_its_lease_runs_out(
    user, make_conversation, make_task
):
    # "Pausing": the worker still holds the lease on step 1's call. Neither the
    # to-do list, nor the "Needs you" count, nor a conversation's badge, nor
    # the task page's "Next decision" may call it a decision before the worker
    # is gone; once its lease runs out, all of them do, alike.
    conversation = make_conversation(owner=user, title="pausing")
    task = make_task(
        conversation=conversation,
        status="paused",
        lease_owner="worker:still-on-it",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
    )
    step = task.steps.create(position=1, title="a", tool="t", status="running")
    elsewhere = make_task(conversation=make_conversation(owner=user), status="running")

    def seen() -> tuple:
        row = conversation_list(user=user).get(pk=conversation.pk)
        return (
            [s.pk for s in todo_for_user(user=user).decisions],
            dashboard_totals(user=user).needing_you,
            conversation_list(user=user, needs_you=True).count(),
            row.needs_you_count,
            next_decision_for_user(user=user, after=elsewhere),
        )

    assert seen() == ([], 0, 0, 0, None)
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert seen() == ([step.pk], 1, 1, 1, step)


def test_the_step_in_flight_comes_from_the_page_rows_or_is_read_when_elsewhere(
    user, make_conversation, make_task, django_assert_num_queries
):
    task = make_task(
        conversation=make_conversation(owner=user),
        status="running",
        lease_owner="worker:on-it",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
    )
    add_steps(task, 150, done=120)
    task.steps.filter(position=121).update(status="running", attempts=1)
    _, current, _ = task_timeline(task=task)  # steps 101-150
    with django_assert_num_queries(0):
        assert step_in_flight(task=task, rows=current).position == 121
    _, first_page, _ = task_timeline(task=task, page=1)  # Dad looks back
    with django_assert_num_queries(1):
        assert step_in_flight(task=task, rows=first_page).position == 121
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    task.refresh_from_db()
    assert step_in_flight(task=task, rows=current) is None  # worker gone


def test_every_door_of_needs_you_agrees_with_the_rule_over_every_status_and_lease(
    user, make_user, make_conversation, make_task, django_assert_num_queries
):
    """The rule (``needs_you_sql``) against its statement in words, over every
    task status, every step status a step can hold alone and three leases:
    the to-do list, the admin's shortcut (``Step.objects.needs_you()``) and
    "Next decision →" (its own statement around the same SQL) find exactly the
    steps it names, in the to-do's order, and never another user's."""
    now = timezone.now()
    leases = {
        "none": {},
        "live": {"lease_owner": "w", "lease_expires_at": now + timedelta(minutes=1)},
        "dead": {"lease_owner": "w", "lease_expires_at": now - timedelta(seconds=1)},
    }
    stopped = {Task.Status.PAUSED, Task.Status.FAILED, Task.Status.NEEDS_REVIEW}
    step_statuses = [s for s in Step.Status if s != Step.Status.DONE]  # needs an output
    expected = []
    other = make_user(username="other")
    for task_status in Task.Status:
        for lease, fields in leases.items():
            for owner in (user, other):
                task = make_task(
                    conversation=make_conversation(owner=owner),
                    title=f"{task_status} {lease}",
                    status=task_status,
                    **fields,
                )
                for position, step_status in enumerate(step_statuses, start=1):
                    step = task.steps.create(
                        position=position, title="s", tool="t", status=step_status
                    )
                    decision = step_status in {"failed", "needs_review"} or (
                        step_status == "running"
                        and task_status in stopped
                        and lease != "live"
                    )
                    if owner == user and decision and task_status != "cancelled":
                        expected.append(step.pk)

    decisions = todo_for_user(user=user).decisions
    assert [s.pk for s in decisions] == expected[:TODO_LIMIT]
    mine = Step.objects.needs_you().filter(task__conversation__owner=user)
    assert sorted(mine.values_list("pk", flat=True)) == sorted(expected)
    assert Step.objects.needs_you().count() == 2 * len(expected)

    first = Step.objects.get(pk=expected[0])
    unrelated = make_task(conversation=make_conversation(owner=user))
    with django_assert_num_queries(1):
        found = next_decision_for_user(user=user, after=unrelated)
    assert (found, found.position, found.task.title) == (
        first,
        first.position,
        first.task.title,
    )
    assert found.task.get_absolute_url() == first.task.get_absolute_url()
    # Outside the first decision's task, the first decision of another task.
    after_first = next_decision_for_user(user=user, after=first.task)
    assert after_first.pk == next(
        pk for pk in expected if Step.objects.get(pk=pk).task_id != first.task_id
    )
    # Another user's decisions are theirs alone.
    theirs = next_decision_for_user(user=other, after=unrelated)
    assert Task.objects.get(pk=theirs.task_id).conversation.owner == other
