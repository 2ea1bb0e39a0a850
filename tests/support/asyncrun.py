"""Run an async test scenario in a thread of its own.

Playwright's sync API (the browser tests) leaves an event loop running in the
test thread for the rest of the session, so ``anyio.run`` there refuses
("cannot be called from a running event loop"). A fresh thread has no loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio


def run_async(scenario: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``scenario(*args)`` to completion on a new event loop in a new thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, scenario, *args).result()
