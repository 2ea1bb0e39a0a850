"""Fixtures for the notifications app's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _test_tools(tool_log):
    """Every test here may run the test tools (``tests.support.tools``); their
    calls, in this process or a child it starts, are logged to ``tool_log``."""
