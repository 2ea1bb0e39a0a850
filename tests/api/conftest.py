"""API fixtures: a user with a bearer token, and a client that sends it."""

from __future__ import annotations

import pytest

from api.services import token_create
from tests.support.plans import CLOSES_CHART_PLAN


class ApiClient:
    """Django's test client with ``Authorization: Bearer`` and JSON bodies."""

    def __init__(self, client, raw_token: str):
        self.client = client
        self.headers = {"Authorization": f"Bearer {raw_token}"}

    def get(self, path, **kwargs):
        return self.client.get(path, headers=self.headers, **kwargs)

    def post(self, path, data=None, **kwargs):
        return self.client.post(
            path, data, content_type="application/json", headers=self.headers, **kwargs
        )

    def put(self, path, data=None, **kwargs):
        return self.client.put(
            path, data, content_type="application/json", headers=self.headers, **kwargs
        )

    def upload(self, path, body: bytes, media_type="text/plain", **kwargs):
        return self.client.generic(
            "POST", path, body, content_type=media_type, headers=self.headers, **kwargs
        )


@pytest.fixture
def make_api_client(client, make_user):
    def make(user=None):
        user = user or make_user()
        new = token_create(user=user, name="test runner")
        api_client = ApiClient(client, new.raw)
        api_client.user = user
        api_client.raw_token = new.raw
        return api_client

    return make


@pytest.fixture
def api_client(make_api_client, user):
    return make_api_client(user)


def new_task(api_client, **extra) -> dict:
    """Create a task of CLOSES_CHART_PLAN in a new conversation; return its document."""
    body = {
        "conversation_title": "Closes",
        "title": "Chart PIPA",
        "steps": CLOSES_CHART_PLAN,
    }
    response = api_client.post("/api/v1/tasks", {**body, **extra})
    assert response.status_code == 201, response.content
    return response.json()


def run(api_client, task_id, worker="w1"):
    """Ask for the task's next step as ``worker``; return the response."""
    return api_client.post(f"/api/v1/tasks/{task_id}/steps/run", {"worker": worker})


def first_step_done(api_client) -> dict:
    """A new task whose first step a runner did, then gave back the lease."""
    task = new_task(api_client)
    run(api_client, task["id"], worker="w")
    api_client.post(f"/api/v1/tasks/{task['id']}/lease/release", {"worker": "w"})
    return task
