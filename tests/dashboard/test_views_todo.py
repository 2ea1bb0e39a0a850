"""The home page opens with what waits for Dad: one link per decision, paused
tasks that wait only for a resume, a summary and a count in the tab's title.
Home and conversation pages refresh themselves: a 204 while nothing changed."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from dashboard.selectors.home import next_decision_for_user, todo_for_user
from tasks.actions import task_pause
from tasks.models import Task
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease

pytestmark = pytest.mark.django_db

WORKER = "worker:test-todo"
REFRESH = {"HX-Request": "true", "HX-Target": "refresh"}


def _interrupted(conversation, title: str, *, lease_ran_out: bool = True) -> Task:
    """A two-step task whose worker died with a search saved, then paused
    (before the dead worker's lease ran out, with ``lease_ran_out=False``)."""
    task = task_create(
        conversation=conversation,
        title=title,
        steps=[
            {"title": "Search the news", "tool": "demo.search", "args": {}},
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
        ],
    )
    crash_at(task.pk, "after_payload", WORKER)
    if lease_ran_out:
        expire_lease(task.pk)
    task.refresh_from_db()
    task_pause(task=task, actor="demo")
    return task


def _paused(conversation, title: str) -> Task:
    return task_create(
        conversation=conversation,
        title=title,
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
        queue=False,
    )


def _refresh_url(body: str) -> str:
    found = re.search(r'<div id="refresh" hx-get="([^"]+)"', body)
    assert found is not None
    return html.unescape(found[1])


def test_the_home_page_lists_each_decision_with_a_link_to_its_card_and_counts_them(
    dad_client, conversation, user
):
    first = _interrupted(conversation, "Search one")
    second = _interrupted(conversation, "Search two")
    paused = _paused(conversation, "Paused on purpose")
    task_create(
        conversation=conversation,
        title="Busy",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
    )
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert "1 brain working, 2 decisions and 1 paused task wait for you" in body
    assert "<title>(3) Conversations · Pippa Stateful</title>" in body
    for task in (first, second):
        card = f"{task.get_absolute_url()}#attention-1"
        assert f'<a href="{card}"' in body
        # The link leads to the card itself.
        page = dad_client.get(task.get_absolute_url()).content.decode()
        assert 'id="attention-1"' in page
    assert f'<a href="{paused.get_absolute_url()}#task-status"' in body
    assert "Resume “<bdi>Paused on purpose</bdi>”" in body


def test_nothing_waiting_says_so_and_the_title_carries_no_count(dad_client):
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert "No brain working, nothing waits for you" in body
    assert "<title>Conversations · Pippa Stateful</title>" in body


def test_another_users_decisions_are_not_on_my_list(
    dad_client, make_user, make_conversation
):
    theirs = make_conversation(owner=make_user(username="neighbour"), title="Theirs")
    _interrupted(theirs, "Their search")
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert "Their search" not in body
    assert "nothing waits for you" in body


def test_after_a_choice_the_task_page_offers_the_next_decision(
    dad_client, conversation
):
    first = _interrupted(conversation, "Search one")
    second = _interrupted(conversation, "Search two")
    step = first.steps.get(position=1)
    response = dad_client.post(
        reverse("dashboard:step_resolve", args=[first.pk, step.pk]),
        {"action": "adopt"},
        follow=True,
    )
    body = response.content.decode()
    assert "Next decision →" in body
    assert f'href="{second.get_absolute_url()}#attention-1"' in body


def test_the_home_page_refresh_is_204_until_something_changes(
    dad_client, conversation, django_assert_num_queries
):
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    url = _refresh_url(body)
    # The session, its user and the version: a 204 counts nothing else.
    with django_assert_num_queries(3):
        assert dad_client.get(url, headers=REFRESH).status_code == 204
    _interrupted(conversation, "Search one")
    response = dad_client.get(url, headers=REFRESH)
    text = response.content.decode()
    assert response.status_code == 200
    assert text.startswith("<title>(1) Conversations · Pippa Stateful</title>")
    assert '<section id="todo" class="card todo attention"' in text
    assert 'hx-swap-oob="true"' in text
    assert "<html" not in text
    assert dad_client.get(_refresh_url(text), headers=REFRESH).status_code == 204


def test_the_home_page_refresh_shows_a_decision_once_a_dead_workers_lease_runs_out(
    dad_client, conversation
):
    # The worker died mid-step under a pause; its lease still runs, so the step
    # is still in flight, not a decision. Nothing is written when the lease
    # runs out, but the refresh must notice and list the decision.
    task = _interrupted(conversation, "Search two", lease_ran_out=False)
    body = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert "Decide step 1" not in body
    url = _refresh_url(body)
    assert dad_client.get(url, headers=REFRESH).status_code == 204

    expire_lease(task.pk)
    response = dad_client.get(url, headers=REFRESH)
    assert response.status_code == 200
    text = response.content.decode()
    assert text.startswith("<title>(1) Conversations · Pippa Stateful</title>")
    assert "Decide step 1 of “<bdi>Search two</bdi>”" in text
    assert dad_client.get(_refresh_url(text), headers=REFRESH).status_code == 204


def test_the_conversation_page_refreshes_itself_the_same_way(dad_client, conversation):
    page = dad_client.get(conversation.get_absolute_url()).content.decode()
    url = _refresh_url(page)
    assert dad_client.get(url, headers=REFRESH).status_code == 204
    task = _paused(conversation, "A new task")
    response = dad_client.get(url, headers=REFRESH)
    assert response.status_code == 200
    assert (
        '<div id="conversation-body" hx-swap-oob="true">' in response.content.decode()
    )
    assert task.title in response.content.decode()


def test_a_refresh_of_another_users_conversation_is_404(conversation, make_user):
    stranger = Client()
    stranger.force_login(make_user(username="stranger"))
    url = f"{conversation.get_absolute_url()}?version=x"
    assert stranger.get(url, headers=REFRESH).status_code == 404


@pytest.mark.parametrize("question", ["next_decision", "todo"])
def test_asking_what_else_needs_dad_reads_the_attention_index_not_his_history(
    question, conversation, user
):
    """The task page's "Next decision →" (asked at every page open and live
    update) and the to-do list read the few steps that may need a person,
    through the partial index tasks_step_attention: not every step of every
    task Dad ever ran, which made a task page's cost grow with his history.
    The plans are SQLite's for the queries as sent (bound parameters)."""
    if connection.vendor != "sqlite":
        pytest.skip("reads SQLite's query plans")
    waiting = _interrupted(conversation, "Search one")
    for n in range(3):
        task_create(
            conversation=conversation,
            title=f"History {n}",
            steps=[
                {"title": f"s{i}", "tool": "demo.closes", "args": {}} for i in range(20)
            ],
            queue=False,
        )
    here = Task.objects.exclude(pk=waiting.pk).first()

    def ask():
        if question == "next_decision":
            return next_decision_for_user(user=user, after=here)
        return todo_for_user(user=user).decisions[0]

    sent = []

    def capture(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        found = ask()
    assert found.task_id == waiting.pk
    assert found.position == 1
    plans = []
    with connection.cursor() as cursor:
        for sql, params in sent:
            if "tasks_step" not in sql or "needs_review" not in sql:
                continue
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            plans.append([row[3] for row in cursor.fetchall()])
    assert plans
    first = plans[0]
    # The steps come from the attention index first, then only their tasks.
    assert any("tasks_step_attention" in line for line in first), first
    assert not any("sqlite_autoindex_tasks_step" in line for line in first), first
