"""The live task page's one poll: only what changed since the page was drawn.

A poll carries the last event seq it showed (``since``), the step page it shows
(``at``) and, while the newest events show, their filter (``events_kind``). It
gets back the next poll, then out of band the status, the rows of the steps
that changed and the newest events; or the whole timeline when its shape
changed. Settled rows are drawn once per server process and reused.
"""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.rows import drawn_events, drawn_rows
from dashboard.views import MSG_BAD_SINCE
from tasks.executor import step
from tasks.models import Task
from tasks.plan import task_create
from tasks.services import event_append
from tests.support.executing import crash_at, expire_lease

pytestmark = pytest.mark.django_db

WORKER = "worker:test-live"
LIVE = {"HX-Request": "true", "HX-Target": "live"}


@pytest.fixture(autouse=True)
def _fresh_rows():
    drawn_rows.clear()
    drawn_events.clear()
    yield
    drawn_rows.clear()
    drawn_events.clear()


def _task(conversation, steps: int = 3, title: str = "Fetch") -> Task:
    return task_create(
        conversation=conversation,
        title="Three fetches",
        steps=[
            {"title": f"{title} {n}", "tool": "demo.closes", "args": {}}
            for n in range(1, steps + 1)
        ],
    )


def _step(task: Task, times: int = 1) -> Task:
    for _ in range(times):
        step(task_id=task.pk, worker_id=WORKER)
    task.refresh_from_db()
    return task


def _poll_url(body: str) -> str | None:
    """The page's own poll, as htmx would send it (hx-get plus hx-include)."""
    found = re.search(r'<div id="live" hx-get="([^"]+)"', body)
    if found is None:
        return None
    url = html.unescape(found[1])
    kind = re.search(r'id="events-live" name="events_kind" value="([^"]*)"', body)
    return url if kind is None else f"{url}&events_kind={kind[1]}"


def _oob_ids(body: str) -> list[str]:
    return re.findall(r'<\w+ (?:hx-swap-oob="true" )?[^>]*?id="([\w-]+)"[^>]*?', body)


def test_a_poll_after_one_step_finished_returns_that_row_and_the_new_events_only(
    dad_client, conversation
):
    task = _step(_task(conversation))  # step 1 done; the task runs on
    page = dad_client.get(task.get_absolute_url()).content.decode()
    url = _poll_url(page)
    assert url is not None
    seen = task.last_seq

    task = _step(task)  # step 2 done
    response = dad_client.get(url, headers=LIVE)
    body = response.content.decode()
    assert response.status_code == 200
    assert "HX-Retarget" not in response
    assert body.lstrip().startswith('<div id="live" hx-get=')
    assert f"since={task.last_seq}" in body
    assert '<li hx-swap-oob="true" class="step step-done" id="step-2">' in body
    assert 'id="step-1"' not in body
    assert 'id="step-3"' not in body
    assert '<div class="card task-status" id="task-status" hx-swap-oob="true">' in body
    assert "<strong>2</strong> of 3 steps done" in body
    assert '<section id="events" aria-labelledby="events-heading" hx-swap-oob' in body
    for seq in range(seen + 1, task.last_seq + 1):
        assert f"<td>{seq}</td>" in body
    assert 'id="timeline"' not in body


def test_the_next_poll_with_nothing_new_is_204(dad_client, conversation):
    task = _step(_task(conversation))
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    _step(task)
    update = dad_client.get(url, headers=LIVE).content.decode()
    response = dad_client.get(_poll_url(update), headers=LIVE)
    assert response.status_code == 204


def test_a_poll_from_a_page_showing_older_events_gets_no_events(
    dad_client, conversation
):
    task = _step(_task(conversation))
    page = dad_client.get(task.get_absolute_url(), {"before": 2}).content.decode()
    assert 'id="events-live"' not in page  # an older page of events: kept as it is
    _step(task)
    body = dad_client.get(_poll_url(page), headers=LIVE).content.decode()
    assert 'id="step-2"' in body
    assert 'id="events"' not in body


def test_a_filtered_event_list_stays_filtered_across_polls(dad_client, conversation):
    task = _step(_task(conversation))
    page = dad_client.get(
        task.get_absolute_url(), {"kind": "tool_result_persisted"}
    ).content.decode()
    assert 'name="events_kind" value="tool_result_persisted"' in page
    _step(task)
    body = dad_client.get(_poll_url(page), headers=LIVE).content.decode()
    events = body[body.index('<section id="events"') :]
    # One result per finished step, and nothing else.
    assert events.count('<span title="tool_result_persisted">') == 2
    assert "call started</span>" not in events


def test_when_the_task_stops_the_poll_gets_the_whole_timeline_and_no_next_poll(
    dad_client, conversation
):
    task = _step(_task(conversation))
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    task = _step(task, times=5)
    assert task.status == Task.Status.DONE
    response = dad_client.get(url, headers=LIVE)
    body = response.content.decode()
    assert response["HX-Retarget"] == "#timeline"
    assert response["HX-Reswap"] == "outerHTML"
    assert body.lstrip().startswith('<section id="timeline"')
    assert '<div id="live"></div>' in body  # no trigger: htmx stops polling
    assert all(f'id="step-{n}"' in body for n in (1, 2, 3))
    assert "Branch from step 1…" in body  # a finished task's rows offer a branch
    assert _poll_url(body) is None


def test_a_step_that_needs_dad_brings_the_whole_timeline_with_its_card(
    dad_client, conversation
):
    task = task_create(
        conversation=conversation,
        title="Search",
        steps=[{"title": "Search the news", "tool": "demo.search", "args": {}}],
    )
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    crash_at(task.pk, "after_payload", WORKER)
    expire_lease(task.pk)
    response = dad_client.get(url, headers=LIVE)
    body = response.content.decode()
    assert response["HX-Retarget"] == "#timeline"
    assert 'id="attention-1"' in body
    # While a card shows, every update is whole, so the card goes when it is done.
    assert "full=1" in _poll_url(body)


def test_when_the_current_step_moves_to_the_next_page_the_timeline_is_whole(
    dad_client, conversation
):
    from dashboard.selectors import STEPS_PER_PAGE

    task = _task(conversation, steps=STEPS_PER_PAGE + 1)
    task = _step(task, times=STEPS_PER_PAGE - 1)
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    assert "at=1" in url
    _step(task, times=1)  # the current step is now on page 2
    response = dad_client.get(url, headers=LIVE)
    assert response["HX-Retarget"] == "#timeline"
    assert f'id="step-{STEPS_PER_PAGE + 1}"' in response.content.decode()


def test_another_users_live_poll_is_404(dad_client, conversation, make_user):
    task = _step(_task(conversation))
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    _step(task)
    stranger = Client()
    stranger.force_login(make_user(username="stranger"))
    assert stranger.get(url, headers=LIVE).status_code == 404


@pytest.mark.parametrize(
    "since",
    ["-1", "{next}", "99999999999999999999999", "1.5", "abc", "x' OR 1=1 --", ""],
)
def test_a_hostile_since_gets_a_clear_400(dad_client, conversation, since):
    task = _step(_task(conversation))
    response = dad_client.get(
        task.get_absolute_url(),
        {"since": since.format(next=task.last_seq + 1), "at": 1},
        headers=LIVE,
    )
    assert response.status_code == 400
    assert response.content.decode() == MSG_BAD_SINCE.format(last_seq=task.last_seq)


def test_a_settled_row_is_drawn_once_and_not_read_again(dad_client, conversation):
    task = _step(_task(conversation), times=2)
    dad_client.get(task.get_absolute_url())
    assert len(drawn_rows) == 3  # two done, one never started
    with CaptureQueriesContext(connection) as ctx:
        body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Fetch 1" in body
    assert "Fetch 3" in body
    # No step's events are read for its attempts: every row was drawn before.
    assert not any(
        '"tasks_event"."step_id" IN' in q["sql"] for q in ctx.captured_queries
    )


def test_a_drawn_row_is_drawn_again_when_its_step_moves_on(dad_client, conversation):
    task = _step(_task(conversation))
    before = dad_client.get(task.get_absolute_url()).content.decode()
    row = before[before.index('id="step-2"') :]
    assert "not started" in row[: row.index("</li>")]
    _step(task)
    after = dad_client.get(task.get_absolute_url()).content.decode()
    row = after[after.index('id="step-2"') :]
    assert 'class="badge status-done"' in row[: row.index("</li>")]


def test_rows_drawn_while_running_get_their_branch_links_when_the_task_stops(
    dad_client, conversation
):
    task = _step(_task(conversation), times=2)
    running = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Branch from step" not in running
    drawn = len(drawn_rows)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    with CaptureQueriesContext(connection) as ctx:
        paused = dad_client.get(task.get_absolute_url()).content.decode()
    assert f'id="branch-{task.steps.get(position=1).pk}"' in paused
    assert "Branch from step 2…" in paused
    assert "Branch from step 3…" not in paused  # not done: nothing to branch from
    assert len(drawn_rows) == drawn  # the same rows, not drawn again
    assert not any(
        '"tasks_event"."step_id" IN' in q["sql"] for q in ctx.captured_queries
    )
    resumed = Task.objects.filter(pk=task.pk).update(status=Task.Status.QUEUED)
    assert resumed == 1
    assert (
        "Branch from step"
        not in dad_client.get(task.get_absolute_url()).content.decode()
    )


def test_a_title_that_looks_like_a_placeholder_is_shown_as_written(
    dad_client, conversation
):
    task = _step(_task(conversation, title="<@axis@> <@oob@> <@branch@>"))
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "&lt;@axis@&gt; &lt;@oob@&gt; &lt;@branch@&gt;" in body
    assert "<@" not in body
    assert "hx-swap-oob" not in body
    assert re.search(r'<svg class="bars" viewBox="0 0 \d+ 14"', body)


def test_event_rows_escape_what_the_data_holds_and_fold_long_data(
    dad_client, conversation
):
    task = _task(conversation)
    event_append(
        task_id=task.pk,
        kind="<b>odd</b>",
        data={"note": "<script>alert(1)</script>", "long": "x" * 120},
    )
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert '<span title="&lt;b&gt;odd&lt;/b&gt;">' in body
    # Folded and pretty-printed (PostgreSQL's jsonb may order the keys its own way).
    assert '<pre class="json-data" tabindex="0">{\n  &quot;' in body
    assert "&quot;note&quot;: &quot;&lt;script&gt;" in body


@pytest.mark.parametrize("side_effects", [False, True])
@pytest.mark.parametrize("artifact_class", [1, 2, 3, 4])
def test_a_step_not_started_is_drawn_as_the_row_template_draws_it(
    conversation, side_effects, artifact_class
):
    from django.template.loader import get_template

    from dashboard import selectors
    from dashboard.rows import AXIS, BRANCH, OOB, ROW_TEMPLATE, untouched_row_html

    task = _task(conversation, title="<b>Fetch</b> & co")
    Step = type(task.steps.first())
    Step.objects.filter(task=task).update(
        side_effects=side_effects, artifact_class=artifact_class
    )
    _, rows, clock = selectors.task_timeline(task=task)
    template = get_template(ROW_TEMPLATE)
    for row in rows:
        context = {"row": row, "task": task, "clock": clock}
        context |= {"axis": AXIS, "oob": OOB, "branch": BRANCH}
        drawn = untouched_row_html(row)
        assert drawn is not None
        assert "&lt;b&gt;Fetch&lt;/b&gt; &amp; co" in drawn
        assert " ".join(drawn.split()) == " ".join(template.render(context).split())


def test_a_step_that_ran_is_not_drawn_as_one_not_started(conversation):
    from dashboard import selectors
    from dashboard.rows import untouched_row_html

    task = _step(_task(conversation))
    _, rows, _ = selectors.task_timeline(task=task)
    assert untouched_row_html(rows[0]) is None  # done
    assert untouched_row_html(rows[1]) is not None


def _same_as_the_template(task: Task, draw) -> int:
    """Compare each row ``draw`` takes with the row partial; return how many."""
    from django.template.loader import get_template

    from dashboard import selectors
    from dashboard.rows import AXIS, BRANCH, OOB, ROW_TEMPLATE

    _, rows, clock = selectors.task_timeline(task=task)
    template = get_template(ROW_TEMPLATE)
    taken = 0
    for row in rows:
        drawn = draw(row, task, clock)
        if drawn is None:
            continue
        taken += 1
        context = {"row": row, "task": task, "clock": clock}
        context |= {"axis": AXIS, "oob": OOB, "branch": BRANCH}
        assert " ".join(drawn.split()) == " ".join(template.render(context).split())
    return taken


@pytest.mark.parametrize("stopped", [False, True])
def test_a_step_done_in_one_attempt_is_drawn_as_the_row_template_draws_it(
    conversation, stopped
):
    from dashboard.rows import done_row_html

    task = _step(_task(conversation, title="<i>Fetch</i>"), times=2)
    if stopped:  # a stopped task's rows offer a branch; and outside effects
        Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
        task.steps.update(side_effects=True)
        task.refresh_from_db()
    assert _same_as_the_template(task, done_row_html) == 2


@pytest.mark.parametrize(
    ("media_type", "payload"),
    [
        ("image/png", b"\x89PNG\r\n\x1a\n"),
        ("application/octet-stream", b"\x00\x01"),
        ("text/plain", b"<b>x</b> " * 200),
    ],
)
def test_outputs_shown_as_image_download_or_excerpt_are_drawn_as_the_template_does(
    make_task, conversation, media_type, payload
):
    from dashboard.rows import done_row_html
    from tests.tasks.dashboard_data import add_steps

    task = make_task(conversation=conversation, status=Task.Status.DONE)
    add_steps(task, 3, done=2, media_type=media_type, payload=payload)
    Task.objects.filter(pk=task.pk).update(title="<Odd> & title")
    task.refresh_from_db()
    assert _same_as_the_template(task, done_row_html) == 2


@pytest.mark.parametrize("month", range(1, 13))
def test_event_times_are_written_as_the_date_filter_writes_them(month):
    from datetime import UTC, datetime

    from django.utils import dateformat, timezone

    from dashboard.rows import _event_times

    at = timezone.localtime(datetime(2026, month, month + 3, 7, 5, 9, 12, tzinfo=UTC))
    assert _event_times(at) == (
        dateformat.format(at, "l j F Y, H:i:s.u e"),
        dateformat.format(at, "j M Y, H:i:s"),
    )
