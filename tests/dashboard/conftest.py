"""Dashboard fixtures: Dad's conversation (the client is ``dad_client``, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def conversation(user, make_conversation):
    """A conversation of ``user`` (Dad) to put tasks in."""
    return make_conversation(owner=user, title="Prices")
