"""Dad's flow on the dashboard: what needs him, one way forward, pause and cancel,
a readable timeline, events he can filter and share, and cheap idle polls."""

from __future__ import annotations

import re

import pytest
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tasks.actions import task_pause
from tasks.demo import LIVE_CONVERSATION
from tasks.executor import step
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease
from tests.support.stepping import run_steps
from tests.tasks.dashboard_data import add_events, add_steps

pytestmark = pytest.mark.django_db

WORKER = "worker:test-flow"
HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def _no_back_off(settings):
    """Failed attempts retry at once here: these tests are about what Dad sees."""
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    settings.PIPPA_RETRY_MAX_SECONDS = 0


@pytest.fixture
def stranger_client(client, make_user):
    from django.test import Client

    other = Client()
    other.force_login(make_user(username="stranger"))
    return other


def _run(task: Task, times: int = 10) -> Task:
    return run_steps(task, WORKER, times)


def _fetched(conversation, title: str = "Fetch") -> Task:
    """A one-step task that fetched closes and is done."""
    task = task_create(
        conversation=conversation,
        title="One",
        steps=[{"title": title, "tool": "demo.closes", "args": {}}],
    )
    return _run(task)


def _interrupted(conversation, tool: str, boundary: str, title: str) -> Task:
    """A two-step task whose worker died at ``boundary`` in step 1, then paused."""
    task = task_create(
        conversation=conversation,
        title=title,
        steps=[
            {"title": f"Run {tool}", "tool": tool, "args": {}},
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
        ],
    )
    crash_at(task.pk, boundary, WORKER)
    expire_lease(task.pk)
    task.refresh_from_db()
    task_pause(task=task, actor="demo")
    return task


# -- needs you ---------------------------------------------------------------


def test_the_list_counts_steps_that_need_dad_even_in_paused_tasks(
    dad_client, conversation, make_conversation, user
):
    _interrupted(conversation, "demo.search", "after_payload", "Interrupted search")
    _interrupted(conversation, "demo.closes", "after_started", "Interrupted fetch")
    calm = make_conversation(owner=user, title="Nothing to do")
    task_create(
        conversation=calm,
        title="Paused on purpose",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
        queue=False,
    )
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    rows = {
        "Prices" if "><bdi>Prices</bdi></a>" in row else "calm": row
        for row in body.split('<li class="row">')[1:]
    }
    # Two decisions, in two paused tasks: counted once, as decisions (the
    # home page's to-do list says the same).
    assert "Needs you: 2 decisions" in rows["Prices"]
    assert "paused" not in rows["Prices"]
    assert "Needs you" not in rows["calm"]
    assert "1 paused" in rows["calm"]
    assert "Needs you (1 conversation)" in body


def test_the_needs_you_filter_keeps_only_conversations_waiting_for_dad(
    dad_client, conversation, make_conversation, user
):
    _interrupted(conversation, "demo.search", "after_payload", "Interrupted search")
    make_conversation(owner=user, title="Calm")
    response = dad_client.get(reverse("dashboard:conversations"), {"needs": "you"})
    body = response.content.decode()
    assert "><bdi>Prices</bdi></a>" in body
    assert "><bdi>Calm</bdi></a>" not in body
    assert "Showing only what needs you" in body
    assert 'name="needs" value="you"' in body  # search keeps the filter


def test_another_users_steps_never_count_toward_my_needs_you(
    dad_client, make_conversation, make_user
):
    theirs = make_conversation(owner=make_user(username="mum"), title="Mum's")
    _interrupted(theirs, "demo.search", "after_payload", "Hers")
    body = dad_client.get(reverse("dashboard:conversations"), {"needs": "you"}).content
    assert b"Mum" not in body
    assert b"Nothing needs you right now." in body


def test_the_needs_you_count_does_not_add_a_query_per_conversation(
    dad_client, user, make_conversation
):
    def count_queries() -> int:
        from django.db import connection

        with CaptureQueriesContext(connection) as ctx:
            assert dad_client.get(reverse("dashboard:conversations")).status_code == 200
        return len(ctx.captured_queries)

    _interrupted(make_conversation(owner=user), "demo.closes", "after_started", "a")
    few = count_queries()
    for n in range(4):
        _interrupted(
            make_conversation(owner=user), "demo.closes", "after_started", f"t{n}"
        )
    assert count_queries() == few


def test_the_conversation_page_marks_the_task_that_needs_dad(dad_client, conversation):
    task = _interrupted(conversation, "demo.search", "after_payload", "Interrupted")
    body = dad_client.get(conversation.get_absolute_url()).content.decode()
    assert "Needs you: 1 decision" in body
    row = body[body.index(f'href="{task.get_absolute_url()}"') :]
    assert '<span class="badge needs-you">Needs you</span>' in row


def test_updated_on_the_list_follows_task_activity(dad_client, conversation):
    long_ago = timezone.now() - timezone.timedelta(days=3)
    type(conversation).objects.filter(pk=conversation.pk).update(updated_at=long_ago)
    task_create(
        conversation=conversation,
        title="Fresh",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
    )
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert "updated <time" in body
    assert "3 days ago" not in body


# -- one way forward ----------------------------------------------------------


def test_an_interrupted_task_offers_one_choice_with_the_saved_search_as_headlines(
    dad_client, conversation
):
    task = _interrupted(conversation, "demo.search", "after_payload", "Search")
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert 'id="resume-button"' not in body
    card = body[body.index('class="card attention"') :]
    use_it = card.index(">Use the saved output</button>")
    saved = card.index("The answer that was saved:")
    assert saved < use_it
    # The two states in one voice: the answer was saved, not "never recorded".
    assert "its answer was saved, but the worker stopped before the step" in card
    assert "never recorded" not in card
    assert '<ol class="headlines" id="saved-headlines-' in card
    assert "PIPA" in card[saved:use_it]  # the search's saved headlines
    assert "{&quot;" not in card[saved:use_it]  # not raw JSON
    first = task.steps.get(position=1)
    link = reverse("dashboard:step_saved_output", args=[task.pk, first.pk])
    assert f'href="{link}"' in card
    assert "What Pippa would do.</strong>" in card


def test_choosing_once_queues_the_task_and_the_worker_finishes_it(
    dad_client, conversation
):
    task = _interrupted(conversation, "demo.search", "after_payload", "Search")
    first = task.steps.get(position=1)
    response = dad_client.post(
        reverse("dashboard:step_resolve", args=[task.pk, first.pk]),
        {"action": "adopt"},
        follow=True,
    )
    assert "the saved output is used; the task goes on by itself" in (
        response.content.decode()
    )
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    assert _run(task).status == Task.Status.DONE


def test_the_saved_output_is_served_sandboxed_and_only_to_its_owner(
    dad_client, stranger_client, conversation
):
    task = _interrupted(conversation, "demo.search", "after_payload", "Search")
    first = task.steps.get(position=1)
    url = reverse("dashboard:step_saved_output", args=[task.pk, first.pk])
    response = dad_client.get(url)
    assert response.status_code == 200
    assert b"PIPA" in b"".join(response.streaming_content)
    assert response["Content-Type"].startswith("text/plain")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response["Content-Security-Policy"]
    assert stranger_client.get(url).status_code == 404


def test_a_step_with_nothing_saved_has_no_saved_output_to_serve(
    dad_client, conversation
):
    task = _interrupted(conversation, "demo.closes", "after_started", "Fetch")
    first = task.steps.get(position=1)
    url = reverse("dashboard:step_saved_output", args=[task.pk, first.pk])
    assert dad_client.get(url).status_code == 404


def test_branch_is_not_offered_from_the_last_step_of_a_finished_task(
    dad_client, conversation
):
    task = _run(
        task_create(
            conversation=conversation,
            title="Two",
            steps=[
                {"title": "Fetch", "tool": "demo.closes", "args": {}},
                {"title": "Search", "tool": "demo.search", "args": {}},
            ],
        )
    )
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Change course after step 1…" in body
    assert "Change course after step 2" not in body
    url = reverse("dashboard:task_branch", args=[task.pk])
    response = dad_client.post(
        url, {"after_position": 2, "confirm": "yes"}, follow=True
    )
    assert "a copy that changes nothing" in response.content.decode()
    assert Task.objects.count() == 1


# -- pause and cancel ----------------------------------------------------------


def _queued(conversation) -> Task:
    return task_create(
        conversation=conversation,
        title="Long job",
        steps=[
            {"title": "Fetch", "tool": "demo.closes", "args": {}},
            {"title": "Search", "tool": "demo.search", "args": {}},
        ],
    )


def test_dad_pauses_a_running_task_in_one_click_and_resumes_it(
    dad_client, conversation
):
    task = _queued(conversation)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Pause after this step" in body
    response = dad_client.post(
        reverse("dashboard:task_pause", args=[task.pk]), follow=True
    )
    # No worker is on it: it stops at once, and the page says after which step.
    assert "Paused “Long job”." in response.content.decode()
    assert "Paused before the first step" in response.content.decode()
    task.refresh_from_db()
    assert task.status == Task.Status.PAUSED
    assert Event.objects.get(task=task, kind="task_paused").data["actor"] == "user:dad"
    assert 'id="resume-button"' in response.content.decode()


def test_cancel_says_what_will_happen_and_needs_a_confirmation(
    dad_client, conversation
):
    task = _queued(conversation)
    url = reverse("dashboard:task_cancel", args=[task.pk])
    page = dad_client.get(url).content.decode()
    assert "Cancel “Long job”?" in page
    assert "A cancelled task cannot be resumed" in page
    assert dad_client.post(url)["Location"] == url
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    response = dad_client.post(url, {"confirm": "yes"}, follow=True)
    assert "Cancelled “Long job”" in response.content.decode()
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED
    assert step(task_id=task.pk, worker_id=WORKER) is None


@pytest.mark.parametrize("action", ["task_pause", "task_cancel"])
def test_another_user_cannot_pause_or_cancel_my_task(
    stranger_client, conversation, action
):
    task = _queued(conversation)
    url = reverse(f"dashboard:{action}", args=[task.pk])
    assert stranger_client.post(url, {"confirm": "yes"}).status_code == 404
    assert stranger_client.get(url).status_code in (404, 405)
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    assert not Event.objects.filter(
        task=task, kind__in=["task_paused", "task_cancelled"]
    ).exists()


# -- a timeline he can read -----------------------------------------------------


def test_a_retried_step_shows_its_failed_attempts_with_their_reasons(
    dad_client, conversation
):
    task = task_create(
        conversation=conversation,
        title="Outage",
        steps=[
            {
                "title": "Search the news",
                "tool": "demo.search",
                "args": {"fail_until_generation": 1},
                "max_attempts": 2,
            }
        ],
    )
    _run(task)
    from tasks.actions import step_retry

    step_retry(step=task.steps.get(), actor="user:dad")
    _run(task)
    assert task.status == Task.Status.DONE
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "3 attempts, 2 that did not finish" in body
    assert body.count("<strong>failed</strong>") == 2
    assert "simulated outage" in body
    assert "<strong>dad</strong> started the step over as a new request" in body
    assert 'class="bar bar-failed"' in body
    assert 'class="bar bar-done"' in body
    assert ", from its first call to its last." in body


def test_the_bars_are_svg_attributes_never_inline_styles(dad_client, conversation):
    task = _fetched(conversation)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert '<svg class="bars"' in body
    assert " style=" not in body
    assert 'class="bar-track" x="0" y="6" width="100%"' in body  # the whole axis
    # Bars are in ms from the first call; the axis is the task's span in ms.
    span = int(re.search(r'<svg class="bars" viewBox="0 0 (\d+) 14"', body)[1])
    x, width = map(
        int,
        re.search(r'class="bar bar-done" x="(\d+)" y="2" width="(\d+)"', body).groups(),
    )
    assert span >= 1
    assert width >= 1
    assert x + width <= span + 2  # one step: its bar is (about) the whole axis


def test_a_waiting_step_shows_when_its_next_attempt_is(dad_client, conversation):
    task = _queued(conversation)
    Step.objects.filter(task=task, position=1).update(
        next_attempt_at=timezone.now() + timezone.timedelta(seconds=90), attempts=1
    )
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "next attempt in 1 min" in body


def test_artifact_classes_are_an_engineers_words_under_each_steps_details(
    dad_client, conversation
):
    task = _queued(conversation)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    head = body[: body.index('<h2 id="timeline-heading">')]
    assert "FILE, FETCH" not in body
    assert '<span class="cls' not in head
    details = body[body.index('<details class="engineer step-details">') :]
    assert '<span class="cls cls-2">fetch</span> data that can be fetched again' in (
        details
    )


# -- events ------------------------------------------------------------------------


def test_the_event_filter_lists_only_kinds_present_and_pushes_the_url(
    dad_client, conversation
):
    task = _fetched(conversation)
    # What the event log's fold loads when Dad opens it.
    body = dad_client.get(
        task.get_absolute_url(), headers={"HX-Request": "true", "HX-Target": "events"}
    ).content.decode()
    select = body[body.index('<select id="event-kind"') : body.index("</select>")]
    assert 'value="tool_call_started"' in select
    assert 'value="task_branched"' not in select
    assert 'value="step_retried"' not in select
    assert 'hx-push-url="true"' in body


def test_events_are_grouped_by_step_and_attempt_with_folded_json(
    dad_client, conversation
):
    task = _fetched(conversation, "Fetch closes")
    body = dad_client.get(task.get_absolute_url(), {"kind": ""}).content.decode()
    events = body[body.index('<section id="events"') :]
    assert "Step 1: <bdi>Fetch closes</bdi> · attempt 1</th>" in events
    assert "The task</th>" in events
    assert '<pre class="json-data"' in events  # long data folds open
    assert "<details><summary><code>" in events
    assert 'title="tool_call_started">call started</span>' in events


def test_a_shared_filter_url_opens_filtered(dad_client, conversation):
    task = _fetched(conversation)
    body = dad_client.get(
        task.get_absolute_url(), {"kind": "tool_result_persisted"}
    ).content.decode()
    events = body[body.index('<section id="events"') :]
    assert '<option value="tool_result_persisted" selected>' in events
    assert "call started</span>" not in events


# -- cheap polls -------------------------------------------------------------------


def test_an_idle_poll_gets_204_and_a_changed_task_gets_the_fragment(
    dad_client, conversation
):
    task = _queued(conversation)
    url = task.get_absolute_url()
    headers = {**HTMX, "HX-Target": "timeline"}
    unchanged = dad_client.get(url, {"since": task.last_seq}, headers=headers)
    assert unchanged.status_code == 204
    assert unchanged.content == b""
    add_events(task, 1)
    changed = dad_client.get(url, {"since": task.last_seq - 1}, headers=headers)
    assert changed.status_code == 200
    assert changed.content.decode().lstrip().startswith('<section id="timeline"')
    assert f"since={task.last_seq}" in changed.content.decode()


def test_the_events_poll_is_204_when_nothing_happened(dad_client, conversation):
    task = _queued(conversation)
    headers = {**HTMX, "HX-Target": "events"}
    response = dad_client.get(
        task.get_absolute_url(), {"since": task.last_seq}, headers=headers
    )
    assert response.status_code == 204


def test_the_idle_poll_reads_only_the_task_row(dad_client, conversation):
    from django.db import connection

    task = _queued(conversation)
    add_steps(task, 50)
    with CaptureQueriesContext(connection) as ctx:
        dad_client.get(
            task.get_absolute_url(),
            {"since": task.last_seq},
            headers={**HTMX, "HX-Target": "timeline"},
        )
    sql = " ".join(q["sql"] for q in ctx.captured_queries)
    assert "tasks_step" not in sql
    assert "tasks_event" not in sql


def test_an_idle_poll_costs_the_session_the_user_and_one_row(
    dad_client, conversation, django_assert_num_queries
):
    task = _queued(conversation)
    add_steps(task, 50)
    with django_assert_num_queries(3):
        response = dad_client.get(
            task.get_absolute_url(),
            {"since": task.last_seq},
            headers={**HTMX, "HX-Target": "timeline"},
        )
    assert response.status_code == 204


@pytest.mark.parametrize("since", ["{seq}", "{seq}9", "-1", "x' OR 1=1 --"])
def test_another_users_idle_poll_is_404_whatever_it_claims_to_have_seen(
    client, make_user, conversation, since
):
    task = _queued(conversation)
    client.force_login(make_user())
    response = client.get(
        task.get_absolute_url(),
        {"since": since.format(seq=task.last_seq)},
        headers={**HTMX, "HX-Target": "timeline"},
    )
    assert response.status_code == 404


def test_staff_polling_any_task_gets_204_when_nothing_changed(
    client, make_user, conversation
):
    task = _queued(conversation)
    client.force_login(make_user(is_staff=True))
    response = client.get(
        task.get_absolute_url(),
        {"since": task.last_seq},
        headers={**HTMX, "HX-Target": "timeline"},
    )
    assert response.status_code == 204


def test_a_poll_does_not_consume_the_flash_message(dad_client, conversation):
    task = _queued(conversation)
    dad_client.post(reverse("dashboard:task_pause", args=[task.pk]))
    task_resume_url = reverse("dashboard:task_resume", args=[task.pk])
    dad_client.post(task_resume_url)
    poll = dad_client.get(
        task.get_absolute_url(), headers={**HTMX, "HX-Target": "timeline"}
    )
    assert "Queued “Long job”" not in poll.content.decode()
    page = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Queued “Long job” for the worker." in page


def test_excerpts_are_preserved_across_polls(dad_client, conversation):
    task = _queued(conversation)
    _run(task, times=2)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.QUEUED)
    body = dad_client.get(
        task.get_absolute_url(), headers={**HTMX, "HX-Target": "timeline"}
    ).content.decode()
    assert '<pre class="excerpt" id="excerpt-' in body
    assert "hx-preserve" in body


# -- the demo keeps a task live ------------------------------------------------------


def test_run_the_demo_task_starts_a_fresh_live_task_once_the_last_finished(
    dad_client, user, make_conversation
):
    demo = make_conversation(owner=user, title=LIVE_CONVERSATION)
    old = task_create(
        conversation=demo,
        title="old",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
    )
    body = dad_client.get(demo.get_absolute_url()).content.decode()
    assert "Run the demo task" not in body  # one is still queued
    _run(old)
    body = dad_client.get(demo.get_absolute_url()).content.decode()
    assert "Run the demo task" in body
    response = dad_client.post(reverse("dashboard:demo_live_run", args=[demo.pk]))
    fresh = Task.objects.exclude(pk=old.pk).get()
    assert response["Location"] == fresh.get_absolute_url()
    assert fresh.status == Task.Status.QUEUED
    assert fresh.steps_total == 8


def test_run_the_demo_task_is_refused_elsewhere_and_to_others(
    dad_client, stranger_client, user, make_conversation
):
    demo = make_conversation(owner=user, title=LIVE_CONVERSATION)
    other = make_conversation(owner=user, title="Not the demo")
    assert (
        stranger_client.post(
            reverse("dashboard:demo_live_run", args=[demo.pk])
        ).status_code
        == 404
    )
    assert (
        dad_client.post(reverse("dashboard:demo_live_run", args=[other.pk])).status_code
        == 404
    )
    assert Task.objects.count() == 0


def test_pippa_demo_run_again_starts_a_fresh_live_task_when_the_last_finished(user):
    from django.core.management import call_command

    from tasks.models import Conversation

    call_command("pippa_demo", verbosity=0)
    demo = Conversation.objects.get(title=LIVE_CONVERSATION)
    live = demo.tasks.get()
    call_command("pippa_demo", verbosity=0)
    assert demo.tasks.count() == 1  # still queued: nothing new
    Task.objects.filter(pk=live.pk).update(status=Task.Status.DONE)
    call_command("pippa_demo", verbosity=0)
    assert demo.tasks.filter(status=Task.Status.QUEUED).count() == 1
    assert demo.tasks.count() == 2


def test_an_interrupted_chart_is_drawn_on_its_card_from_a_sandboxed_source(
    dad_client, conversation
):
    task = task_create(
        conversation=conversation,
        title="Chart",
        steps=[
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
            {"title": "Draw", "tool": "demo.chart", "args": {"source": 1}},
        ],
    )
    step(task_id=task.pk, worker_id=WORKER)
    crash_at(task.pk, "after_payload", WORKER)
    expire_lease(task.pk)
    task_pause(task=Task.objects.get(pk=task.pk), actor="demo")
    chart = task.steps.get(position=2)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    card = body[body.index('class="card attention"') :]
    url = reverse("dashboard:step_saved_output", args=[task.pk, chart.pk])
    assert f'<img class="saved-picture" id="saved-img-{chart.pk}"' in card
    assert f'src="{url}"' in card
    assert "not shown here" not in card
    response = dad_client.get(url)
    assert response["Content-Type"] == "image/svg+xml"
    assert "sandbox" in response["Content-Security-Policy"]
    assert "script-src" not in response["Content-Security-Policy"]


def test_an_outside_call_card_says_what_was_sent_where_and_when(
    dad_client, conversation
):
    task = _interrupted(conversation, "demo.notify", "after_started", "Tell Dad")
    body = dad_client.get(task.get_absolute_url()).content.decode()
    card = body[body.index('class="card attention"') :]
    assert "<strong>What was sent outside Pippa:</strong>" in card
    assert "<code>demo.notify</code>" in card
    assert '<time datetime="' in card[card.index("What was sent") :]


def test_a_finished_task_leads_with_its_final_output_drawn_large(
    dad_client, conversation
):
    task = task_create(
        conversation=conversation,
        title="Chart",
        steps=[
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
            {"title": "Draw the chart", "tool": "demo.chart", "args": {"source": 1}},
        ],
    )
    task = _run(task)
    assert task.status == Task.Status.DONE
    body = dad_client.get(task.get_absolute_url()).content.decode()
    result = body.index('<section class="card final-output"')
    assert result < body.index('<h2 id="timeline-heading">')
    section = body[result : body.index("</section>", result)]
    assert "From step 2, <bdi>Draw the chart</bdi>." in section
    assert 'class="final-picture"' in section or '<pre class="excerpt"' in section
