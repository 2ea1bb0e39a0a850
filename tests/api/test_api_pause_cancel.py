"""The JSON API's pause and cancel: the executor's services, owner-scoped."""

from __future__ import annotations

import pytest

from tasks.models import Event, Task
from tests.api.conftest import new_task, run

pytestmark = pytest.mark.django_db


def test_a_runner_pauses_a_queued_task_and_resumes_it(api_client):
    task = new_task(api_client)
    response = api_client.post(f"/api/v1/tasks/{task['id']}/pause")
    assert response.status_code == 200
    assert response.json()["status"] == "paused"
    ran = run(api_client, task["id"])
    assert ran.json()["ran"] is False
    assert api_client.post(f"/api/v1/tasks/{task['id']}/resume").json()["status"] == (
        "queued"
    )


def test_a_runner_cancels_a_task_and_it_no_longer_runs(api_client):
    task = new_task(api_client)
    response = api_client.post(f"/api/v1/tasks/{task['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    ran = run(api_client, task["id"])
    assert ran.json()["ran"] is False
    event = Event.objects.get(task_id=task["id"], kind=Event.Kind.TASK_CANCELLED)
    assert event.data["actor"] == f"api:{api_client.user.get_username()}"


def test_cancelling_twice_is_a_409_with_the_reason(api_client):
    task = new_task(api_client)
    api_client.post(f"/api/v1/tasks/{task['id']}/cancel")
    response = api_client.post(f"/api/v1/tasks/{task['id']}/cancel")
    assert response.status_code == 409
    assert "only an unfinished task can be cancelled" in response.json()["detail"]


def test_pausing_a_cancelled_task_is_a_409(api_client):
    task = new_task(api_client)
    api_client.post(f"/api/v1/tasks/{task['id']}/cancel")
    response = api_client.post(f"/api/v1/tasks/{task['id']}/pause")
    assert response.status_code == 409
    assert "only a queued or running task can be paused" in response.json()["detail"]


@pytest.mark.parametrize("action", ["pause", "cancel"])
def test_another_users_task_cannot_be_paused_or_cancelled(make_api_client, action):
    mine = make_api_client()
    theirs = make_api_client()
    task = new_task(mine)
    response = theirs.post(f"/api/v1/tasks/{task['id']}/{action}")
    assert response.status_code == 404
    assert Task.objects.get(pk=task["id"]).status == Task.Status.QUEUED
    assert not Event.objects.filter(
        task_id=task["id"],
        kind__in=[Event.Kind.TASK_PAUSED, Event.Kind.TASK_CANCELLED],
    ).exists()


def test_the_openapi_schema_lists_pause_and_cancel(client):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert "/api/v1/tasks/{task_id}/pause" in paths
    assert "/api/v1/tasks/{task_id}/cancel" in paths
