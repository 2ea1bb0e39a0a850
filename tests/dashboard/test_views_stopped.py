"""A step Dad stopped ("Stop here") is his decision: "stopped by you", off his
to-do list and every "needs you" count, with its other ways forward still on
its card."""

from __future__ import annotations

import pytest
from django.urls import reverse

from dashboard.selectors.home import next_decision_for_user
from notifications.models import Notice
from notifications.outbox import notify_deliver, notify_settings_save
from tasks.actions import step_resolve, task_pause
from tasks.models import Step, Task
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed(conversation):
    """A search whose worker died in the middle of its call: it waits for Dad."""
    task = task_create(
        conversation=conversation,
        title="Chart PIPA",
        steps=[
            {"title": "Search the news", "tool": "demo.search", "args": {}},
            {"title": "Chart", "tool": "demo.closes", "args": {}},
        ],
    )
    crash_at(task.pk, "after_started", "worker:test-stopped")
    expire_lease(task.pk)
    task.refresh_from_db()
    task_pause(task=task, actor="demo")
    assert Step.objects.needs_you().filter(task=task).exists()
    return task


def test_a_failed_step_is_a_decision_until_dad_stops_it(dad_client, failed, user):
    assert next_decision_for_user(user=user, after=Task(pk=0)) is not None
    home = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert f'href="{failed.get_absolute_url()}#attention-1"' in home

    dad_client.post(
        reverse(
            "dashboard:step_resolve", args=[failed.pk, failed.steps.get(position=1).pk]
        ),
        {"action": "fail"},
    )

    step = failed.steps.get(position=1)
    assert (step.status, step.stopped) == (Step.Status.FAILED, True)
    assert not Step.objects.needs_you().filter(pk=step.pk).exists()
    assert next_decision_for_user(user=user, after=Task(pk=0)) is None
    home = dad_client.get(reverse("dashboard:conversations")).content.decode()
    assert "#attention-1" not in home
    assert "nothing waits for you" in home
    assert "Needs you" not in home


def test_the_stopped_steps_card_says_who_stopped_it_and_offers_the_other_ways(
    dad_client, failed
):
    step = failed.steps.get(position=1)
    step_resolve(step=step, action="fail", actor="user:dad")

    page = dad_client.get(failed.get_absolute_url()).content.decode()

    assert "Step 1, stopped by you" in page
    assert "you chose “Stop here”" in page
    assert "Stopped at step 1 by you" in page
    assert "stopped by you</span>" in page  # the status badge
    assert "needs you" not in page.lower().replace("step 1, stopped by you", "")
    assert "It failed every attempt it was allowed" not in page
    assert f'id="choose-{step.pk}-retry"' in page
    assert f'id="choose-{step.pk}-skip"' in page
    assert f'id="choose-{step.pk}-fail"' not in page


def test_starting_a_stopped_step_over_makes_it_an_ordinary_step_again(
    dad_client, failed
):
    step = failed.steps.get(position=1)
    step_resolve(step=step, action="fail", actor="user:dad")

    dad_client.post(reverse("dashboard:step_retry", args=[failed.pk, step.pk]))

    step.refresh_from_db()
    failed.refresh_from_db()
    assert (step.status, step.stopped) == (Step.Status.PENDING, False)
    assert failed.status == Task.Status.QUEUED


def test_no_message_goes_out_for_a_step_dad_stopped(failed, user, settings):
    settings.PIPPA_NOTIFY_URLS = ["mailto://127.0.0.1:9?from=pippa@example.org"]
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    notify_settings_save(user=user, enabled=True, addresses="dad@example.org")
    step = failed.steps.get(position=1)
    Notice.objects.create(owner=user, step=step, reason=step.status)

    step_resolve(step=step, action="fail", actor="user:dad")
    report = notify_deliver(worker_id="worker:mail")

    assert (report.messages, report.dropped) == (0, 1)
    assert Notice.objects.get().state == Notice.State.DROPPED


def test_a_program_reading_the_task_sees_the_step_dad_stopped_as_stopped(
    failed, user, client
):
    """The JSON API and MCP (one document, tasks.documents) say "stopped", so an
    agent does not take Dad's decision for a failure to retry."""
    from api.services import token_create
    from tasks.documents import task_payload

    step = failed.steps.get(position=1)
    url = f"/api/v1/tasks/{failed.pk}"
    bearer = {"Authorization": f"Bearer {token_create(user=user, name='agent').raw}"}
    before = client.get(url, headers=bearer).json()
    assert [s["stopped"] for s in before["steps"]] == [False, False]

    step_resolve(step=step, action="fail", actor="dad")

    answer = client.get(url, headers=bearer).json()
    assert [(s["status"], s["stopped"]) for s in answer["steps"]] == [
        ("failed", True),
        ("pending", False),
    ]
    failed.refresh_from_db()
    assert task_payload(failed)["steps"] == answer["steps"]
