"""Times that tell the truth: the wait for Dad is not work.

An interrupted call is a mark where it began (how long it ran is not known),
not a bar to the end of the axis; a step's "took" is its calls' time, not the
back-off or the decision between them; a stopped task's clock ends with its
last call; "Running for" keeps counting; "Cancelled after step 3, 8 s ago"
cannot be read as "step 38".
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dashboard.selectors.timeline import task_timeline
from tasks.actions import step_resolve, task_cancel, task_pause
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease, run_task

pytestmark = pytest.mark.django_db

WAITED = timedelta(minutes=5, seconds=40)


def _event_times(events, by: timedelta) -> None:
    """Move ``events`` ``by`` into the past (the log refuses updates, so as a
    test's own SQL: the events happened earlier, nothing else changes)."""
    with connection.cursor() as cursor:
        for pk, at in events.values_list("pk", "created_at"):
            cursor.execute(
                f"UPDATE {Event._meta.db_table} SET created_at = %s WHERE id = %s",
                [at - by, pk],
            )


def _backdate(task: Task, by: timedelta) -> None:
    """Move everything that happened so far ``by`` into the past: Dad looks now."""
    _event_times(Event.objects.filter(task=task), by)
    for step in Step.objects.filter(task=task):
        Step.objects.filter(pk=step.pk).update(
            started_at=step.started_at and step.started_at - by,
            finished_at=step.finished_at and step.finished_at - by,
        )


@pytest.fixture
def interrupted(conversation):
    task = task_create(
        conversation=conversation,
        title="Chart PIPA",
        steps=[
            {"title": "Search the news", "tool": "demo.search", "args": {}},
            {"title": "Chart", "tool": "demo.closes", "args": {}},
        ],
    )
    crash_at(task.pk, "after_started", "worker:test-time")
    expire_lease(task.pk)
    task.refresh_from_db()
    task_pause(task=task, actor="demo")
    _backdate(task, WAITED)
    task.refresh_from_db()
    return task


def test_an_interrupted_call_is_a_mark_not_a_bar_to_the_end_of_the_axis(interrupted):
    _, rows, clock = task_timeline(task=interrupted)
    [attempt] = rows[0].attempts

    assert attempt.outcome == "interrupted"
    assert attempt.bar_w == 1
    assert clock.worked < timedelta(minutes=1)


def test_the_interrupted_steps_row_says_no_took_and_no_started_ago(
    dad_client, interrupted
):
    page = dad_client.get(interrupted.get_absolute_url()).content.decode()
    row = page[page.index('id="step-1"') : page.index('id="step-2"')]
    assert "took" not in row
    assert "started" not in row
    assert "interrupted" in row


def test_a_stopped_tasks_clock_ends_with_its_last_call_not_with_dads_decision(
    dad_client, interrupted
):
    step = interrupted.steps.get(position=1)
    step_resolve(step=step, action="fail", actor="user:dad")
    interrupted.refresh_from_db()

    _, rows, clock = task_timeline(task=interrupted)
    page = dad_client.get(interrupted.get_absolute_url()).content.decode()

    assert clock.worked < timedelta(minutes=1)
    assert "5 min" not in page.split('id="timeline-heading"')[0]


def test_a_retried_steps_took_leaves_out_the_wait_between_its_attempts(
    conversation, settings, tool_log
):
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    task = task_create(
        conversation=conversation,
        title="Flaky",
        steps=[{"title": "fetch", "tool": "test.flaky", "args": {"fail_times": 1}}],
    )
    run_task(task.pk)
    first = Event.objects.filter(task=task, kind="tool_call_started").order_by("seq")[0]
    # The first attempt happened minutes before the second.
    _event_times(Event.objects.filter(task=task, seq__lte=first.seq + 1), WAITED)
    Step.objects.filter(task=task).update(started_at=first.created_at - WAITED)

    _, rows, _ = task_timeline(task=task)

    assert rows[0].step.duration > WAITED
    assert rows[0].worked < timedelta(seconds=30)


def test_cancelled_after_a_step_reads_with_a_comma_before_the_time(
    dad_client, conversation
):
    task = task_create(
        conversation=conversation,
        title="Three fetches",
        steps=[
            {"title": f"Fetch {n}", "tool": "demo.closes", "args": {}}
            for n in (1, 2, 3)
        ],
    )
    run_task(task.pk, limit=1)
    expire_lease(task.pk)  # its worker has gone
    task.refresh_from_db()
    task_cancel(task=task, actor="user:dad")
    Task.objects.filter(pk=task.pk).update(
        finished_at=timezone.now() - timedelta(seconds=8)
    )
    page = dad_client.get(task.get_absolute_url()).content.decode()
    said = " ".join(page.split())
    assert "<strong>Cancelled after step 1</strong>, 8 s ago" in said


def test_running_for_carries_its_milliseconds_for_the_page_to_keep_counting(
    dad_client, conversation
):
    task = task_create(
        conversation=conversation,
        title="Slow",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
    )
    Task.objects.filter(pk=task.pk).update(status=Task.Status.RUNNING)
    Step.objects.filter(task=task).update(
        started_at=timezone.now() - timedelta(seconds=4), status=Step.Status.RUNNING
    )
    page = dad_client.get(task.get_absolute_url()).content.decode()
    assert 'class="running-for" data-ms="' in page
