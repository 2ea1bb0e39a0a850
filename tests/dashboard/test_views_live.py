"""The live task page's one poll: only what changed since the page was drawn.

A poll carries the last event seq it showed (``since``), the step page it shows
(``at``) and, while the newest events show, their filter (``events_kind``). It
gets back the next poll, then out of band the status, the rows of the steps
that changed and the newest events; or the whole timeline when its shape
changed.
"""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.views import MSG_BAD_SINCE
from tasks.executor import step
from tasks.models import Task
from tasks.plan import task_create
from tasks.services import event_append
from tests.support.executing import crash_at, expire_lease

pytestmark = pytest.mark.django_db

WORKER = "worker:test-live"
LIVE = {"HX-Request": "true", "HX-Target": "live"}
# What the event log's fold sends when Dad opens it (htmx, once).
EVENT_LOG = {"HX-Request": "true", "HX-Target": "events"}


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
    dad_client, fetch_task
):
    task = _step(fetch_task())  # step 1 done; the task runs on
    page = dad_client.get(task.get_absolute_url(), {"kind": ""}).content.decode()
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
    assert "<span>2 of 3 steps done</span>" in body
    assert '<section id="events" aria-labelledby="events-heading" hx-swap-oob' in body
    for seq in range(seen + 1, task.last_seq + 1):
        assert f"<td>{seq}</td>" in body
    assert 'id="timeline"' not in body


def test_the_task_page_folds_its_event_log_and_draws_it_only_when_opened(
    dad_client, fetch_task, make_user
):
    task = _step(fetch_task())
    url = task.get_absolute_url()
    dad_client.get(url)  # the rows cache holds the step rows for both
    with CaptureQueriesContext(connection) as folded_queries:
        page = dad_client.get(url).content.decode()
    with CaptureQueriesContext(connection) as open_queries:
        opened = dad_client.get(url, {"kind": ""}).content.decode()
    fold = page[page.index('<details id="events-fold">') :]
    fold = fold[: fold.index("</details>")]
    # No count in the fold's line: a page left open would show it stale.
    assert ">Event log</h2>" in fold
    assert 'hx-trigger="toggle from:#events-fold once"' in fold
    assert '<a href="?kind=#events">Show the event log</a>' in fold  # without JS
    assert "<table" not in fold
    assert 'id="events-live"' not in page  # a folded log is not polled for
    # Two queries fewer (the newest events and their kinds) than with it open.
    assert len(folded_queries) == len(open_queries) - 2

    assert '<details id="events-fold" open>' in opened
    log = dad_client.get(url, headers=EVENT_LOG).content.decode()
    assert log.lstrip().startswith('<section id="events"')
    for seq in range(1, task.last_seq + 1):
        assert f"<td>{seq}</td>" in log
    # Another user's fold asks for Dad's log: 404, as for the page itself.
    stranger = Client()
    stranger.force_login(make_user(username="stranger"))
    assert stranger.get(url, headers=EVENT_LOG).status_code == 404
    assert stranger.get(url, {"kind": ""}).status_code == 404
    # Once opened on a running task, the page's poll brings the new events.
    poll = _poll_url(page.replace(fold, log))
    assert "events_kind=" in poll
    seen = task.last_seq
    task = _step(task)
    body = dad_client.get(poll, headers=LIVE).content.decode()
    assert f"<td>{seen + 1}</td>" in body


def test_a_page_with_its_event_log_folded_polls_without_events(dad_client, fetch_task):
    task = _step(fetch_task())
    page = dad_client.get(task.get_absolute_url()).content.decode()
    assert "events_kind" not in _poll_url(page)
    task = _step(task)
    body = dad_client.get(_poll_url(page), headers=LIVE).content.decode()
    assert 'id="step-2"' in body
    assert 'id="events"' not in body
    assert "<td>" not in body


def test_the_next_poll_with_nothing_new_is_204(dad_client, fetch_task):
    task = _step(fetch_task())
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    _step(task)
    update = dad_client.get(url, headers=LIVE).content.decode()
    response = dad_client.get(_poll_url(update), headers=LIVE)
    assert response.status_code == 204


def test_a_poll_from_a_page_showing_older_events_gets_no_events(dad_client, fetch_task):
    task = _step(fetch_task())
    page = dad_client.get(task.get_absolute_url(), {"before": 2}).content.decode()
    assert 'id="events-live"' not in page  # an older page of events: kept as it is
    _step(task)
    body = dad_client.get(_poll_url(page), headers=LIVE).content.decode()
    assert 'id="step-2"' in body
    assert 'id="events"' not in body


def test_a_filtered_event_list_stays_filtered_across_polls(dad_client, fetch_task):
    task = _step(fetch_task())
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
    dad_client, fetch_task
):
    task = _step(fetch_task())
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
    assert (
        "Change course after step 1…" in body
    )  # a finished task's rows offer a branch
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
    dad_client, fetch_task
):
    from dashboard.selectors.timeline import STEPS_PER_PAGE

    task = fetch_task(STEPS_PER_PAGE + 1)
    task = _step(task, times=STEPS_PER_PAGE - 1)
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    assert "at=1" in url
    _step(task, times=1)  # the current step is now on page 2
    response = dad_client.get(url, headers=LIVE)
    assert response["HX-Retarget"] == "#timeline"
    assert f'id="step-{STEPS_PER_PAGE + 1}"' in response.content.decode()


def test_another_users_live_poll_is_404(dad_client, fetch_task, make_user):
    task = _step(fetch_task())
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    _step(task)
    stranger = Client()
    stranger.force_login(make_user(username="stranger"))
    assert stranger.get(url, headers=LIVE).status_code == 404


@pytest.mark.parametrize(
    "since",
    ["-1", "{next}", "99999999999999999999999", "1.5", "abc", "x' OR 1=1 --", ""],
)
def test_a_hostile_since_gets_a_clear_400(dad_client, fetch_task, since):
    task = _step(fetch_task())
    response = dad_client.get(
        task.get_absolute_url(),
        {"since": since.format(next=task.last_seq + 1), "at": 1},
        headers=LIVE,
    )
    assert response.status_code == 400
    assert response.content.decode() == MSG_BAD_SINCE.format(last_seq=task.last_seq)


def test_a_drawn_row_is_drawn_again_when_its_step_moves_on(dad_client, fetch_task):
    task = _step(fetch_task())
    before = dad_client.get(task.get_absolute_url()).content.decode()
    row = before[before.index('id="step-2"') :]
    assert "not started" in row[: row.index("</li>")]
    _step(task)
    after = dad_client.get(task.get_absolute_url()).content.decode()
    row = after[after.index('id="step-2"') :]
    assert 'class="badge status-done"' in row[: row.index("</li>")]


def test_rows_offer_their_branch_links_only_while_the_task_is_stopped(
    dad_client, fetch_task
):
    task = _step(fetch_task(), times=2)
    running = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Change course after step" not in running
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    paused = dad_client.get(task.get_absolute_url()).content.decode()
    assert f'id="branch-{task.steps.get(position=1).pk}"' in paused
    assert "Change course after step 2…" in paused
    assert (
        "Change course after step 3…" not in paused
    )  # not done: nothing to branch from
    resumed = Task.objects.filter(pk=task.pk).update(status=Task.Status.QUEUED)
    assert resumed == 1
    assert (
        "Change course after step"
        not in dad_client.get(task.get_absolute_url()).content.decode()
    )


def test_a_title_that_looks_like_a_placeholder_is_shown_as_written(
    dad_client, fetch_task
):
    task = _step(fetch_task(title="<@axis@> <@oob@> <@branch@>"))
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "&lt;@axis@&gt; &lt;@oob@&gt; &lt;@branch@&gt;" in body
    assert "<@" not in body
    assert "hx-swap-oob" not in body
    assert re.search(r'<svg class="bars" viewBox="0 0 \d+ 14"', body)


def test_event_rows_escape_what_the_data_holds_and_fold_long_data(
    dad_client, fetch_task
):
    task = fetch_task()
    event_append(
        task_id=task.pk,
        kind="<b>odd</b>",
        data={"note": "<script>alert(1)</script>", "long": "x" * 120},
    )
    body = dad_client.get(task.get_absolute_url(), headers=EVENT_LOG).content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert '<span title="&lt;b&gt;odd&lt;/b&gt;">' in body
    # Folded and pretty-printed (PostgreSQL's jsonb may order the keys its own way).
    assert '<pre class="json-data" tabindex="0">{\n  &quot;' in body
    assert "&quot;note&quot;: &quot;&lt;script&gt;" in body


def test_event_times_are_the_date_filters_in_the_sites_time_zone(
    dad_client, fetch_task, settings
):
    from django.utils import dateformat, timezone

    settings.TIME_ZONE = "Pacific/Chatham"  # +12:45 or +13:45: never UTC's clock
    task = fetch_task()
    at = task.events.get(seq=1).created_at
    body = dad_client.get(task.get_absolute_url(), headers=EVENT_LOG).content.decode()
    with timezone.override("Pacific/Chatham"):
        local = timezone.localtime(at)
    assert f'title="{dateformat.format(local, "l j F Y, H:i:s.u e")}"' in body
    assert f">{dateformat.format(local, 'j M Y, H:i:s')}</time>" in body
    assert f'datetime="{dateformat.format(local, "c")}"' in body


def test_no_python_module_draws_page_markup():
    """Rows are the template's partials; no module writes an element's markup."""
    from pathlib import Path

    import dashboard

    root = Path(dashboard.__file__).parent
    assert not (root / "rows.py").exists()
    for path in root.rglob("*.py"):
        text = path.read_text()
        for tag in ("<li", "<tr", "<svg", "<div", "<pre"):
            assert tag not in text, f"{path.name} writes {tag}"


def _in_flight(task: Task, position: int) -> Task:
    """A worker is calling step ``position`` now (as between its two envelopes)."""
    from datetime import timedelta

    from django.utils import timezone

    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner=WORKER,
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    task.steps.filter(position=position).update(
        status="running", attempts=1, started_at=timezone.now()
    )
    task.refresh_from_db()
    return task


def test_the_status_names_the_step_in_flight(dad_client, fetch_task):
    task = _in_flight(_step(fetch_task()), 2)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "<strong>Now:</strong> step 2 of 3, <bdi>Fetch 2</bdi>, started" in body
    assert '<time class="ago"' in body


def test_a_pause_while_a_step_is_in_flight_says_pausing_then_paused_after_that_step(
    dad_client, fetch_task
):
    from django.urls import reverse

    task = _in_flight(_step(fetch_task()), 2)
    response = dad_client.post(
        reverse("dashboard:task_pause", args=[task.pk]), follow=True
    )
    body = response.content.decode()
    assert "Pausing “Three fetches”: step 2 finishes first, then it stops." in body
    assert "<strong>Pausing:</strong> finishing step 2 first…" in body
    url = _poll_url(body)
    assert url is not None
    assert "lease=1" in url
    assert 'hx-trigger="every 2s"' in body
    assert dad_client.get(url, headers=LIVE).status_code == 204  # nothing yet

    # The worker finishes step 2 and lets go (as the executor does at a pause).
    Task.objects.filter(pk=task.pk).update(
        lease_owner="", lease_expires_at=None, steps_done=2
    )
    first = task.steps.get(position=1)
    task.steps.filter(position=2).update(status="done", output=first.output)
    update = dad_client.get(url, headers=LIVE)
    assert update.status_code == 200
    assert update["HX-Retarget"] == "#timeline"
    text = update.content.decode()
    assert "<strong>Paused after step 2</strong>" in text
    assert 'class="step step-done" id="step-2"' in text
    assert 'hx-trigger="every 10s"' in text  # slower: only a person can move it now


def test_a_worker_that_stops_answering_is_shown_within_one_poll(dad_client, fetch_task):
    task = _in_flight(_step(fetch_task()), 2)
    url = _poll_url(dad_client.get(task.get_absolute_url()).content.decode())
    assert dad_client.get(url, headers=LIVE).status_code == 204
    expire_lease(task.pk)  # no event is written when a worker dies
    update = dad_client.get(url, headers=LIVE).content.decode()
    assert "The worker stopped answering" in update


def test_a_stale_tab_on_a_decision_another_tab_took_corrects_itself_in_one_poll(
    dad_client, conversation, fetch_task
):
    from django.urls import reverse

    task = _step(fetch_task())
    step2 = task.steps.get(position=2)
    step2.status = "failed"
    step2.attempts = 3
    step2.save(update_fields=["status", "attempts"])
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.FAILED, lease_owner="", lease_expires_at=None
    )
    task.refresh_from_db()
    stale = dad_client.get(task.get_absolute_url()).content.decode()
    assert f'id="choose-{step2.pk}-skip"' in stale
    url = _poll_url(stale)
    assert url is not None
    assert "every 10s" in stale
    other = Client()
    other.force_login(task.conversation.owner)
    other.post(
        reverse("dashboard:step_resolve", args=[task.pk, step2.pk]), {"action": "skip"}
    )
    update = dad_client.get(url, headers=LIVE)
    assert update.status_code == 200
    assert f'id="choose-{step2.pk}-skip"' not in update.content.decode()
    assert "step 2" not in update.content.decode().split('id="timeline-heading"')[0]


def test_durations_leave_out_the_time_the_task_was_paused(dad_client, fetch_task):
    import time

    from dashboard.selectors.clock import task_clock
    from tasks.actions import task_pause, task_resume

    task = _step(fetch_task())
    task_pause(task=task, actor="user:dad")
    task.refresh_from_db()
    paused = dad_client.get(task.get_absolute_url()).content.decode()
    assert "before the pause" in paused
    assert "Took" not in paused
    time.sleep(0.4)  # Dad comes back later
    task_resume(task=Task.objects.get(pk=task.pk), actor="user:dad")
    task = _step(Task.objects.get(pk=task.pk))
    clock = task_clock(task=task)
    assert clock.paused.total_seconds() >= 0.4
    assert clock.worked == clock.elapsed - clock.paused
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "paused</p>" not in body
    assert ", not counting " in body


def test_a_branchs_clock_starts_at_its_own_first_call(dad_client, fetch_task):
    from datetime import timedelta

    from django.utils import timezone

    from tasks.actions import task_branch

    parent = _step(fetch_task())
    parent.steps.filter(position=1).update(
        started_at=timezone.now() - timedelta(hours=2)
    )
    Task.objects.filter(pk=parent.pk).update(status=Task.Status.PAUSED)
    parent.refresh_from_db()
    branch = task_branch(task=parent, after_position=1, actor="user:dad")
    _step(branch)
    body = dad_client.get(branch.get_absolute_url()).content.decode()
    assert (
        "2 h"
        not in body[
            body.index('id="task-status"') : body.index(
                "</div>", body.index('id="task-status"')
            )
        ]
    )
