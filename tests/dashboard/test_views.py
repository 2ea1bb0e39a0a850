"""Dad's dashboard, read-only pages: who sees what, and what the pages show."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.db.models import FETCH_RAISE
from django.db.models import query as query_module
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from artifacts.models import Artifact, ArtifactClass
from council.models import CouncilRound, Participant, Turn
from dashboard.selectors.events import EVENTS_PER_PAGE, task_events
from dashboard.selectors.home import (
    CONVERSATIONS_PER_PAGE,
    dashboard_totals,
    todo_for_user,
)
from dashboard.selectors.timeline import STEPS_PER_PAGE
from tasks.models import Step, Task
from tests.tasks.dashboard_data import add_events, add_steps

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_lazy_loads(monkeypatch):
    """Every queryset raises on a lazy related or deferred load (Django 6.1)."""
    monkeypatch.setattr(query_module, "DEFAULT_FETCH_MODE", FETCH_RAISE)


@pytest.fixture
def stranger(make_user):
    return make_user(username="stranger")


# -- login wall ------------------------------------------------------------


def test_every_page_sends_an_anonymous_visitor_to_log_in(client, make_task):
    task = make_task()
    urls = [
        reverse("dashboard:conversations"),
        reverse("dashboard:conversation", args=[task.conversation_id]),
        reverse("dashboard:conversation_delete", args=[task.conversation_id]),
        reverse("dashboard:task", args=[task.pk]),
        reverse("dashboard:task_resume_context", args=[task.pk]),
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_every_action_sends_an_anonymous_visitor_to_log_in_and_changes_nothing(
    client, make_task
):
    task = make_task(status=Task.Status.PAUSED)
    step = add_steps(task, 1, status=Step.Status.FAILED)[0]
    urls = [
        reverse("dashboard:conversation_delete", args=[task.conversation_id]),
        reverse("dashboard:task_resume", args=[task.pk]),
        reverse("dashboard:task_branch", args=[task.pk]),
        reverse("dashboard:step_retry", args=[task.pk, step.pk]),
        reverse("dashboard:step_resolve", args=[task.pk, step.pk]),
    ]
    for url in urls:
        response = client.post(url, {"after_position": 1, "action": "skip"})
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/"), url
    task.refresh_from_db()
    step.refresh_from_db()
    assert task.status == Task.Status.PAUSED
    assert step.status == Step.Status.FAILED
    assert Task.objects.count() == 1


# -- conversation list -----------------------------------------------------


def test_the_list_shows_my_conversations_with_task_progress_and_not_others(
    dad_client, user, stranger, make_conversation, make_task
):
    mine = make_conversation(owner=user, title="Holiday photos")
    make_conversation(owner=stranger, title="Stranger's secret plans")
    running = make_task(conversation=mine, status=Task.Status.RUNNING)
    add_steps(running, 4, done=1)
    review = make_task(conversation=mine, status=Task.Status.NEEDS_REVIEW)
    add_steps(review, 1, done=1)
    add_steps(review, 1, status=Step.Status.NEEDS_REVIEW)

    response = dad_client.get(reverse("dashboard:conversations"))

    assert response.status_code == 200
    body = response.content.decode()
    assert "Holiday photos" in body
    assert "Stranger" not in body
    assert "2 of 6 steps" in body
    assert "1 running" in body
    assert "Needs you: 1 decision" in body
    assert "2 tasks" in body


def test_staff_see_every_conversation_with_its_owner(
    client, make_user, make_conversation
):
    make_conversation(title="Mum's recipes", owner=make_user(username="mum"))
    client.force_login(make_user(username="boss", is_staff=True))
    body = client.get(reverse("dashboard:conversations")).content.decode()
    assert "Mum&#x27;s recipes" in body
    assert "mum" in body


def test_search_finds_conversations_by_their_title_or_a_task_title(
    dad_client, user, make_conversation, make_task
):
    make_conversation(owner=user, title="Garden plans")
    other = make_conversation(owner=user, title="Misc")
    make_task(conversation=other, title="Fetch tomato prices")
    make_conversation(owner=user, title="Unrelated")

    by_title = dad_client.get(reverse("dashboard:conversations"), {"q": "garden"})
    by_task = dad_client.get(reverse("dashboard:conversations"), {"q": "TOMATO"})
    nothing = dad_client.get(reverse("dashboard:conversations"), {"q": "zebra"})

    assert "Garden plans" in by_title.content.decode()
    assert "Misc" not in by_title.content.decode()
    assert "Misc" in by_task.content.decode()
    assert "Unrelated" not in by_task.content.decode()
    assert "No conversation or task matches “zebra”" in nothing.content.decode()


def test_search_as_you_type_returns_only_the_results_fragment_for_htmx(
    dad_client, user, make_conversation
):
    make_conversation(owner=user, title="Garden plans")
    response = dad_client.get(
        reverse("dashboard:conversations"),
        {"q": "gard"},
        headers={"HX-Request": "true", "HX-Target": "conversation-results"},
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="conversation-results"')
    assert "<html" not in body
    assert "Garden plans" in body


def test_search_as_you_type_reads_neither_the_to_do_list_nor_the_needs_you_count(
    dad_client, user, make_conversation, make_task
):
    from django.core.cache import caches
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    waiting = make_task(conversation=make_conversation(owner=user, title="Garden"))
    waiting.steps.create(position=1, title="Decide", tool="t", status="needs_review")
    url = reverse("dashboard:conversations")
    with CaptureQueriesContext(connection) as whole:
        page = dad_client.get(url, {"q": "gard"}).content.decode()
    with CaptureQueriesContext(connection) as typed:
        results = dad_client.get(
            url,
            {"q": "gard"},
            headers={"HX-Request": "true", "HX-Target": "conversation-results"},
        ).content.decode()
    assert 'id="todo"' in page
    assert "Decide step 1" in page  # the whole page reads and shows the to-do
    assert 'id="todo"' not in results
    assert "Garden" in results
    # The to-do's queries are the difference, and nothing else (the needs-you
    # count and the to-do's count of working tasks are one query of the page's
    # totals, read with the to-do; cleared here, since the page kept them).
    caches["default"].clear()
    totals = dashboard_totals(user=user)
    with CaptureQueriesContext(connection) as to_do:
        todo_for_user(user=user, totals=totals)
    assert len(to_do) > 0
    assert len(whole) - len(typed) == len(to_do)


def test_the_list_is_paginated_and_its_query_count_does_not_grow(
    dad_client, user, make_conversation, make_task, django_assert_max_num_queries
):
    def count_queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert dad_client.get(reverse("dashboard:conversations")).status_code == 200
        return len(ctx.captured_queries)

    for i in range(3):
        make_task(conversation=make_conversation(owner=user, title=f"c{i}"))
    few = count_queries()
    for i in range(CONVERSATIONS_PER_PAGE + 5):
        make_task(conversation=make_conversation(owner=user, title=f"more {i}"))
    many = count_queries()
    assert few == many
    page_two = dad_client.get(reverse("dashboard:conversations"), {"page": 2})
    assert "Page 2 of 2" in page_two.content.decode()


# -- conversation page -----------------------------------------------------


def test_a_conversation_page_shows_its_tasks_and_council_rounds(
    dad_client, user, make_conversation, make_task
):
    conversation = make_conversation(owner=user, title="Stock study")
    task = make_task(conversation=conversation, title="Plot closes", brain="claude")
    add_steps(task, 5, done=2)
    make_task(conversation=conversation, title="Second look", status="needs_review")
    council = CouncilRound.objects.create(
        conversation=conversation, number=1, topic="Which chart?"
    )
    alice = Participant.objects.create(round=council, name="Ada", brain="kimi")
    Turn.objects.create(round=council, participant=alice, order=1, text="A bar chart")

    response = dad_client.get(conversation.get_absolute_url())

    body = response.content.decode()
    assert response.status_code == 200
    assert "Plot closes" in body
    assert "2 of 5 steps" in body
    assert '<progress value="2" max="5"' in body
    # The brain is an engineer's word: the task's own page has it, folded.
    assert "claude" not in body
    assert "needs review" in body
    assert "Round 1: <bdi>Which chart?</bdi>" in body
    assert "<bdi>Ada</bdi> · no conclusion yet" in body
    assert "1 turn" in body


def test_a_conversation_page_reads_no_step_or_event_rows(
    dad_client, user, make_conversation, make_task
):
    conversation = make_conversation(owner=user)
    task = make_task(conversation=conversation)
    add_steps(task, 3, done=1)
    add_events(task, 5)
    with CaptureQueriesContext(connection) as ctx:
        response = dad_client.get(conversation.get_absolute_url())
    assert response.status_code == 200
    sql = " ".join(q["sql"] for q in ctx.captured_queries)
    assert "tasks_event" not in sql
    # Steps appear only as the "needs you" count inside the task-list query.
    step_queries = [q["sql"] for q in ctx.captured_queries if "tasks_step" in q["sql"]]
    assert len(step_queries) == 1
    assert 'FROM "tasks_task"' in step_queries[0]
    assert "COUNT(" in step_queries[0]


def test_another_users_conversation_is_not_found(
    dad_client, stranger, make_conversation
):
    theirs = make_conversation(owner=stranger, title="Private")
    response = dad_client.get(theirs.get_absolute_url())
    assert response.status_code == 404
    assert b"Private" not in response.content


def test_staff_may_open_anyones_conversation(client, make_user, make_conversation):
    theirs = make_conversation(title="Someone's")
    client.force_login(make_user(username="boss", is_staff=True))
    assert client.get(theirs.get_absolute_url()).status_code == 200


# -- task page ---------------------------------------------------------------


@pytest.fixture
def running_task(user, make_conversation, make_task):
    conversation = make_conversation(owner=user, title="Stock study")
    task = make_task(
        conversation=conversation,
        title="Chart the closes",
        status=Task.Status.RUNNING,
        brain="codex",
        lease_owner="worker:host-7",
        lease_expires_at=timezone.now() + timezone.timedelta(seconds=50),
    )
    add_steps(task, 3, done=2, artifact_class=ArtifactClass.FETCH)
    return task


def test_the_task_page_shows_every_step_in_order_with_status_attempts_and_class(
    dad_client, running_task
):
    response = dad_client.get(running_task.get_absolute_url())
    body = response.content.decode()
    assert response.status_code == 200
    positions = [body.index(f"Step number {n}") for n in (1, 2, 3)]
    assert positions == sorted(positions)
    # The artifact class is an engineer's word: only under each row's Details.
    assert body.count('<summary>Details<span class="visually-hidden"> of step') == 3
    assert body.count('<span class="cls cls-2">fetch</span>') == 3
    assert ">fetch</span>" in body
    assert "attempt 1 of 3" in body
    assert "took 2.0 s" in body
    assert "✓" not in body  # the check mark comes from CSS, the word from HTML
    assert "done</span>" in body
    assert "pending</span>" in body
    assert "Brain <code>codex</code>" in body  # under Details for an engineer


def test_the_task_page_says_a_worker_is_on_it_and_folds_the_lease_details(
    dad_client, running_task
):
    body = dad_client.get(running_task.get_absolute_url()).content.decode()
    assert "A worker is on it now." in body
    fold = body[body.index('<details class="engineer">') :]
    assert "Lease held by <code>worker:host-7</code>" in fold
    assert "until" in fold
    assert "Lease: held by" not in body


def test_an_expired_lease_says_so(dad_client, running_task):
    Task.objects.filter(pk=running_task.pk).update(
        lease_expires_at=timezone.now() - timezone.timedelta(minutes=5)
    )
    body = dad_client.get(running_task.get_absolute_url()).content.decode()
    assert "The worker stopped answering" in body
    assert "5 min ago; the next worker will take over" in body


def test_a_text_output_is_shown_as_an_escaped_excerpt_with_size_and_links(
    dad_client, user, make_conversation, make_task
):
    task = make_task(conversation=make_conversation(owner=user), status="paused")
    add_steps(
        task,
        1,
        done=1,
        payload=b"<script>alert('pwned')</script> quotes " + b"x" * 2000,
        artifact_class=ArtifactClass.SNAPSHOT,
    )
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in body
    assert "<script>alert" not in body
    assert "2.0\xa0KB" in body
    assert ">snapshot</span>" in body
    assert "…</pre>" in body


def test_a_task_page_polls_while_anything_can_change_and_slower_when_it_waits(
    dad_client, running_task
):
    def trigger():
        body = dad_client.get(running_task.get_absolute_url()).content.decode()
        found = re.search(r'<div id="live"[^>]*hx-trigger="every (\d+)s"', body)
        return (int(found[1]) if found else None), body

    assert trigger()[0] == 2
    # Paused, but the worker is still on its step: it may finish any moment.
    Task.objects.filter(pk=running_task.pk).update(status=Task.Status.PAUSED)
    assert trigger()[0] == 2
    # Paused and let go: only a person (another tab) can change it.
    Task.objects.filter(pk=running_task.pk).update(
        lease_owner="", lease_expires_at=None
    )
    assert trigger()[0] == 10
    Task.objects.filter(pk=running_task.pk).update(status=Task.Status.DONE)
    every, done = trigger()
    assert every is None
    assert "Nothing more will change" in done


def test_an_htmx_poll_gets_only_the_timeline_fragment(dad_client, running_task):
    response = dad_client.get(
        running_task.get_absolute_url(),
        headers={"HX-Request": "true", "HX-Target": "timeline"},
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="timeline"')
    assert "<html" not in body
    assert "Step number 3" in body
    assert 'id="events"' not in body


def test_the_events_are_newest_first_paginated_and_filterable_by_kind(
    dad_client, running_task
):
    add_events(running_task, EVENTS_PER_PAGE + 10, kind="lease_renewed")
    add_events(running_task, 3, kind="tool_call_started")
    last = running_task.last_seq

    first_page = dad_client.get(
        running_task.get_absolute_url(), {"kind": ""}
    ).content.decode()
    assert f"<td>{last}</td>" in first_page
    assert "Older events →" in first_page
    assert "<td>1</td>" not in first_page

    older = dad_client.get(
        running_task.get_absolute_url(),
        {"before": last - EVENTS_PER_PAGE + 1},
        headers={"HX-Request": "true", "HX-Target": "events"},
    ).content.decode()
    assert older.lstrip().startswith('<section id="events"')
    assert "<td>1</td>" in older
    assert "Older events →" not in older

    filtered = dad_client.get(
        running_task.get_absolute_url(), {"kind": "tool_call_started"}
    ).content.decode()
    assert filtered.count('<span title="tool_call_started">call started</span>') == 3
    assert '<span title="lease_renewed">' not in filtered


def test_the_task_page_query_count_does_not_grow_with_steps_or_events(
    dad_client, user, make_conversation, make_task
):
    def count_queries(task) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert dad_client.get(task.get_absolute_url()).status_code == 200
        return len(ctx.captured_queries)

    conversation = make_conversation(owner=user)
    small = make_task(conversation=conversation, status="running")
    add_steps(small, 3, done=2)
    add_events(small, 5)
    big = make_task(conversation=conversation, status="running")
    add_steps(big, 250, done=120)
    add_events(big, 400)
    assert count_queries(small) == count_queries(big)


def test_the_events_of_many_steps_cost_no_query_per_step(
    dad_client, user, make_conversation, make_task
):
    """The events section reads each event's step with the event (its
    position and title only): a group head reads no field left behind."""
    conversation = make_conversation(owner=user)
    task = make_task(conversation=conversation, status="running")
    steps = add_steps(task, 30, done=20)
    for step in steps:
        add_events(task, 2, kind="tool_call_started", step=step)
    plain = make_task(conversation=conversation, status="running")
    add_steps(plain, 30, done=20)
    add_events(plain, 60, kind="tool_call_started")

    def count_queries(task) -> tuple[int, str]:
        with CaptureQueriesContext(connection) as ctx:
            response = dad_client.get(task.get_absolute_url(), {"kind": ""})
        assert response.status_code == 200
        return len(ctx.captured_queries), response.content.decode()

    with_steps, body = count_queries(task)
    assert "Step 30: <bdi>Step number 30</bdi>" in body
    assert with_steps == count_queries(plain)[0]
    page = task_events(task=task)
    assert {"args", "error", "started_at"} <= page.events[0].step.get_deferred_fields()


def test_a_long_timeline_opens_at_the_page_of_the_current_step(
    dad_client, user, make_conversation, make_task
):
    per_page = STEPS_PER_PAGE
    total = per_page * 2 + per_page // 2
    task = make_task(conversation=make_conversation(owner=user), status="running")
    add_steps(task, total, done=per_page * 3 // 2)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert f"Steps {per_page + 1}–{per_page * 2} of {total}" in body
    assert f"Step number {per_page * 3 // 2 + 1}<" in body
    assert f"Step number {per_page - 1}<" not in body
    first = dad_client.get(task.get_absolute_url(), {"page": 1}).content.decode()
    assert f"Steps 1–{per_page} of {total}" in first
    assert "Current step" in first


def test_another_users_task_is_not_found(
    dad_client, stranger, make_conversation, make_task
):
    task = make_task(conversation=make_conversation(owner=stranger), title="Secret")
    for url in (
        task.get_absolute_url(),
        reverse("dashboard:task_resume_context", args=[task.pk]),
    ):
        response = dad_client.get(url)
        assert response.status_code == 404
        assert b"Secret" not in response.content


def test_the_task_page_carries_a_content_security_policy_and_no_inline_styles(
    dad_client, running_task
):
    response = dad_client.get(running_task.get_absolute_url())
    assert "script-src 'self' 'nonce-" in response["Content-Security-Policy"]
    body = response.content.decode()
    assert "style=" not in body
    assert "<svg" not in body
    assert "<script src" in body
    assert "nonce=" in body


def test_a_widget_output_shows_only_its_png_preview_never_its_markup(
    dad_client, user, make_conversation, make_task
):
    from artifacts.preview import preview_render
    from tests.tasks.dashboard_data import SVG_WIDGET

    task = make_task(conversation=make_conversation(owner=user), status="done")
    widget = add_steps(
        task,
        1,
        done=1,
        artifact_class=ArtifactClass.RENDER,
        payload=SVG_WIDGET,
        media_type="image/svg+xml",
    )[0].output_id
    widget = Artifact.objects.get(pk=widget)
    unrendered = dad_client.get(task.get_absolute_url()).content.decode()
    assert "No picture of this widget has been drawn" in unrendered
    assert reverse("artifacts:source_text", args=[widget.pk]) in unrendered
    assert "preview.png" not in unrendered
    assert "<svg" not in unrendered

    preview_render(artifact=widget)
    rendered = dad_client.get(task.get_absolute_url()).content.decode()
    assert f'src="{reverse("artifacts:preview", args=[widget.pk])}"' in rendered
    assert "<svg" not in rendered
    assert "<circle" not in rendered


def test_an_image_output_is_a_thumbnail_from_our_own_origin(
    dad_client, user, make_conversation, make_task
):
    from tests.tasks.dashboard_data import png_bytes

    task = make_task(conversation=make_conversation(owner=user), status="done")
    image = add_steps(
        task,
        1,
        done=1,
        artifact_class=ArtifactClass.FILE,
        payload=png_bytes(),
        media_type="image/png",
    )[0].output_id
    image = Artifact.objects.get(pk=image)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert (
        f'<img class="thumb" src="{reverse("artifacts:source", args=[image.pk])}"'
        in body
    )
    assert ">file</span>" in body
    assert f'href="{reverse("artifacts:detail", args=[image.pk])}"' in body


def test_a_poll_after_the_session_ended_sends_the_whole_page_to_log_in(
    client, make_task
):
    task = make_task(status=Task.Status.RUNNING)
    response = client.get(
        task.get_absolute_url(),
        headers={
            "HX-Request": "true",
            "HX-Target": "timeline",
            "HX-Current-URL": f"http://testserver{task.get_absolute_url()}",
        },
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/login/?next=%2Ftasks%2F{task.pk}%2F"
    assert b"Log in" not in response.content
