"""Refusals carry their kind: the API answers by type, runners read the code."""

from __future__ import annotations

import io
import json
import urllib.error

import pytest

from brains.runner import HttpBackend, LeaseBusy, ToolFailure
from tasks.models import Step
from tests.api.conftest import first_step_done, new_task, run

pytestmark = pytest.mark.django_db


def test_a_second_worker_gets_a_409_coded_lease_held(api_client):
    task = new_task(api_client)
    run(api_client, task["id"], worker="first")

    response = run(api_client, task["id"], worker="second")

    assert response.status_code == 409
    assert response.json()["code"] == "lease_held"


def test_a_plan_that_changes_history_is_a_409_whatever_its_words(
    api_client, monkeypatch
):
    monkeypatch.setattr(
        "tasks.plan.ERR_DONE_CHANGED", "no: step {position} ({status}) stays put"
    )
    task = first_step_done(api_client)
    steps = Step.objects.filter(task_id=task["id"]).order_by("position")
    new_plan = [
        {"id": steps[0].pk, "title": "Other closes", "tool": "demo.closes"},
        {"id": steps[1].pk, "title": "Chart them", "tool": "demo.chart"},
    ]

    response = api_client.put(f"/api/v1/tasks/{task['id']}/plan", {"steps": new_plan})

    assert response.status_code == 409
    assert response.json() == {
        "detail": "no: step 1 (done) stays put",
        "code": "conflict",
    }


def test_a_plan_naming_an_unknown_tool_is_a_400_coded_invalid(api_client):
    body = {
        "conversation_title": "c",
        "title": "t",
        "steps": [{"title": "x", "tool": "no.such.tool"}],
    }

    response = api_client.post("/api/v1/tasks", body)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"


def test_resuming_a_done_task_is_a_409_coded_conflict(api_client):
    task = new_task(api_client)
    for _ in range(3):
        run(api_client, task["id"])

    response = api_client.post(f"/api/v1/tasks/{task['id']}/resume")

    assert response.status_code == 409
    assert response.json()["code"] == "conflict"


def _refusing(status: int, body: dict):
    def urlopen(request, timeout=None):
        raise urllib.error.HTTPError(
            request.full_url,
            status,
            "refused",
            {},
            io.BytesIO(json.dumps(body).encode()),
        )

    return urlopen


def test_the_http_runner_waits_on_the_lease_code_not_on_words(monkeypatch):
    backend = HttpBackend(base_url="http://pippa.invalid", token="t")
    monkeypatch.setattr(
        "urllib.request.urlopen",
        _refusing(409, {"detail": "busy, try later", "code": "lease_held"}),
    )

    with pytest.raises(LeaseBusy, match="busy, try later"):
        backend.run_step(1, "w")


def test_the_http_runner_does_not_wait_on_a_conflict_that_mentions_a_lease(
    monkeypatch,
):
    backend = HttpBackend(base_url="http://pippa.invalid", token="t")
    monkeypatch.setattr(
        "urllib.request.urlopen",
        _refusing(409, {"detail": "the lease words changed", "code": "conflict"}),
    )

    with pytest.raises(ToolFailure) as excinfo:
        backend.run_step(1, "w")

    assert not isinstance(excinfo.value, LeaseBusy)
    assert str(excinfo.value) == "409: the lease words changed"
