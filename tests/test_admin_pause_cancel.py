"""The admin's pause and cancel actions and its "Needs you" shortcut: the dashboard's services and rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from tasks.admin import MSG_CANCELLED, MSG_PAUSED
from tasks.models import Event, Step, Task

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:tasks_task_changelist"


def _act(client, action: str, tasks, **extra):
    data = {"action": action, "_selected_action": [t.pk for t in tasks], **extra}
    return client.post(reverse(CHANGELIST), data, follow=True)


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_staff_pause_a_running_task_from_the_list(staff_client, make_task):
    task = make_task(status=Task.Status.QUEUED)
    response = _act(staff_client, "pause_tasks", [task])
    assert MSG_PAUSED.format(n=1) in _messages(response)
    task.refresh_from_db()
    assert task.status == Task.Status.PAUSED
    paused = Event.objects.get(task=task, kind=Event.Kind.TASK_PAUSED)
    assert paused.data["actor"] == "staff:operator"


def test_cancel_asks_for_confirmation_first_and_changes_nothing_until_then(
    staff_client, make_task
):
    task = make_task(status=Task.Status.RUNNING)
    response = _act(staff_client, "cancel_tasks", [task])
    page = response.content.decode()
    assert "Cancelling stops each task for good" in page
    assert "Yes, cancel 1 task" in page
    task.refresh_from_db()
    assert task.status == Task.Status.RUNNING
    response = _act(staff_client, "cancel_tasks", [task], confirm="yes")
    assert MSG_CANCELLED.format(n=1) in _messages(response)
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED


def test_cancelling_a_done_task_from_the_admin_is_refused_with_the_reason(
    staff_client, make_task
):
    task = make_task(status=Task.Status.DONE)
    response = _act(staff_client, "cancel_tasks", [task], confirm="yes")
    assert any(
        "only an unfinished task can be cancelled" in m for m in _messages(response)
    )
    task.refresh_from_db()
    assert task.status == Task.Status.DONE


def test_staff_who_may_only_view_cannot_pause_or_cancel(client, make_user, make_task):
    viewer = make_user(username="viewer", is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__startswith="view_")
    )
    client.force_login(viewer)
    task = make_task(status=Task.Status.QUEUED)
    for action in ("pause_tasks", "cancel_tasks"):
        _act(client, action, [task], confirm="yes")
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    assert not Event.objects.filter(task=task).exists()


def test_the_needs_you_shortcut_lists_the_steps_the_dashboard_counts(
    staff_client, make_task
):
    from tests.tasks.dashboard_data import add_steps

    paused = make_task(title="Interrupted", status=Task.Status.PAUSED)
    add_steps(paused, 2)
    Step.objects.filter(task=paused, position=1).update(
        status=Step.Status.RUNNING, title="Left mid-call", started_at=timezone.now()
    )
    live = make_task(title="Running", status=Task.Status.RUNNING)
    add_steps(live, 1, status=Step.Status.RUNNING)
    Step.objects.filter(task=live).update(title="Running now")
    review = make_task(title="Review", status=Task.Status.NEEDS_REVIEW)
    add_steps(review, 1, status=Step.Status.NEEDS_REVIEW)
    Step.objects.filter(task=review).update(title="Set aside")
    cancelled = make_task(title="Cancelled", status=Task.Status.CANCELLED)
    add_steps(cancelled, 1, status=Step.Status.FAILED)
    Step.objects.filter(task=cancelled).update(title="Failed but cancelled")

    index = staff_client.get(reverse("admin:index")).content.decode()
    assert "?needs_review=you" in index
    assert ">Needs you</a>" in index
    page = staff_client.get(
        reverse("admin:tasks_step_changelist") + "?needs_review=you"
    ).content.decode()
    assert "Left mid-call" in page
    assert "Set aside" in page
    assert "Running now" not in page
    assert "Failed but cancelled" not in page
    assert Step.objects.needs_you().count() == 2


def test_the_admin_offers_no_branch_after_the_last_step_of_a_finished_task(
    staff_client, make_task
):
    from tests.tasks.dashboard_data import add_steps

    task = make_task(status=Task.Status.DONE)
    add_steps(task, 3, done=3)
    page = staff_client.get(reverse("admin:tasks_task_branch", args=[task.pk]))
    offered = [k for k, _label, _kept in page.context["choices"]]
    assert offered == [0, 1, 2]
