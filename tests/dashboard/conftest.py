"""Dashboard fixtures: Dad's conversation and tasks in it (the client is
``dad_client``, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def conversation(user, make_conversation):
    """A conversation of ``user`` (Dad) to put tasks in."""
    return make_conversation(owner=user, title="Prices")


@pytest.fixture
def fetch_task(conversation):
    """Make a task of ``steps`` demo fetches ("Fetch 1", ...), in Dad's
    conversation unless another is given; no step has run."""
    from tasks.plan import task_create

    def make(steps: int = 3, *, title: str = "Fetch", conversation=conversation):
        return task_create(
            conversation=conversation,
            title="Three fetches",
            steps=[
                {"title": f"{title} {n}", "tool": "demo.closes", "args": {}}
                for n in range(1, steps + 1)
            ],
        )

    return make
