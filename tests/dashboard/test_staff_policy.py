"""Staff on the dashboard: they see every user's rows where a page reads, and
act only on their own (pippa_site.owners.staff_reads). Changing another
user's task is the admin's (tests/test_admin_pause_cancel.py)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from council.services import round_start
from tasks.models import Conversation, Event, Step, Task
from tests.dashboard.test_views_actions import _failed_search_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def mum(make_user):
    return make_user(username="mum")


@pytest.fixture
def boss_client(client, make_user):
    client.force_login(make_user(username="boss", is_staff=True, is_superuser=True))
    return client


def _state(task: Task) -> tuple:
    return (
        Task.objects.count(),
        Conversation.objects.count(),
        Task.objects.get(pk=task.pk).status,
        list(Step.objects.filter(task=task).values_list("status", "attempts")),
        Event.objects.filter(task=task).count(),
    )


def test_staff_cannot_pause_cancel_branch_retry_decide_or_delete_anothers_task(
    boss_client, mum, make_conversation
):
    failed = _failed_search_task(make_conversation(owner=mum))
    step = failed.steps.get(position=2)
    queued = failed.conversation.tasks.create(
        title="Later", status=Task.Status.QUEUED, steps_total=0
    )
    writes = [
        ("task_pause", [queued.pk], {}),
        ("task_cancel", [queued.pk], {"confirm": "yes"}),
        ("task_resume", [failed.pk], {}),
        ("task_branch", [failed.pk], {"after_position": 1, "confirm": "yes"}),
        ("step_retry", [failed.pk, step.pk], {"confirm": "yes"}),
        ("step_resolve", [failed.pk, step.pk], {"action": "skip", "confirm": "yes"}),
        ("conversation_delete", [failed.conversation_id], {}),
    ]
    before = (_state(failed), _state(queued))
    for name, args, data in writes:
        url = reverse(f"dashboard:{name}", args=args)
        assert boss_client.post(url, data).status_code == 404, name
        # Nor is the confirmation page shown for a write staff cannot make.
        if name in ("task_cancel", "task_branch", "step_retry", "conversation_delete"):
            assert boss_client.get(url).status_code == 404, name
    decide = reverse("dashboard:task_decide", args=[failed.pk, step.position])
    assert boss_client.get(decide).status_code == 404
    assert (_state(failed), _state(queued)) == before


def test_staff_still_read_anothers_conversation_task_artifact_and_round(
    boss_client, mum, make_conversation, make_artifact
):
    task = _failed_search_task(make_conversation(owner=mum, title="Mum's"))
    council_round = round_start(
        conversation=task.conversation, topic="Plans", participants=[("Ada", "echo")]
    )
    artifact = make_artifact(owner=mum)
    step = task.steps.get(position=1)
    for url in (
        reverse("dashboard:conversations"),
        task.conversation.get_absolute_url(),
        task.get_absolute_url(),
        reverse("dashboard:task_resume_context", args=[task.pk]),
        reverse("artifacts:detail", args=[artifact.pk]),
        reverse("artifacts:source", args=[step.output_id]),
        council_round.get_absolute_url(),
    ):
        assert boss_client.get(url).status_code == 200, url
    page = boss_client.get(task.get_absolute_url()).content.decode()
    # What they could not do is not offered: the page says whose it is.
    assert 'id="onlooker"' in page
    assert (
        reverse("dashboard:step_retry", args=[task.pk, task.steps.get(position=2).pk])
        not in page
    )
    assert (
        f"{reverse('dashboard:task_branch', args=[task.pk])}?after_position" not in page
    )
    mums = boss_client.get(task.conversation.get_absolute_url()).content.decode()
    assert 'id="onlooker"' in mums
    assert (
        reverse("dashboard:conversation_delete", args=[task.conversation_id])
        not in mums
    )
    listed = boss_client.get(reverse("dashboard:conversations")).content.decode()
    assert "Mum&#x27;s" in listed or "Mum's" in listed


def test_a_user_who_is_not_staff_sees_nothing_of_anothers(
    client, mum, make_user, make_conversation
):
    task = _failed_search_task(make_conversation(owner=mum))
    client.force_login(make_user(username="dad"))
    assert client.get(task.get_absolute_url()).status_code == 404
    assert (
        client.post(reverse("dashboard:task_resume", args=[task.pk])).status_code == 404
    )


def test_staff_are_not_offered_to_run_or_delete_anothers_demo_conversation(
    boss_client, client, mum, make_conversation
):
    from tasks.demo import LIVE_CONVERSATION

    demo = make_conversation(owner=mum, title=LIVE_CONVERSATION)

    theirs = boss_client.get(demo.get_absolute_url()).content.decode()
    client.force_login(mum)
    hers = client.get(demo.get_absolute_url()).content.decode()

    assert 'id="demo-run"' not in theirs
    assert 'id="onlooker"' in theirs
    assert 'id="demo-run"' in hers
    assert reverse("dashboard:conversation_delete", args=[demo.pk]) in hers
    assert 'id="onlooker"' not in hers
