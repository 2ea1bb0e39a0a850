"""A fixed pool of threads for Django's synchronous code under the ASGI server.

Each of ``PIPPA_WEB_THREADS`` threads is a single-thread executor, lent to one
call at a time: a Django request (``pippa_site.asgi.DjangoApp``, its whole
handler in one hop, once its body is in and until its answer is made), the MCP
door's token check, or a large upload's. A client trickling a body, or reading
an answer slowly, holds no thread; a call waiting for one is a coroutine, not a
thread. Each thread keeps its database connection between calls
(``CONN_MAX_AGE``), as a threaded WSGI server's threads do (Django's own ASGI
handler would run each request's code on a thread made for it and leave a
connection behind each time).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connections


class SyncPool:
    """``size`` single-thread executors, lent one request at a time."""

    def __init__(self, size: int, *, name: str = "pippa-web") -> None:
        self.size = max(1, size)
        self.executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-{n}")
            for n in range(self.size)
        ]
        self._free: asyncio.Queue[ThreadPoolExecutor] | None = None

    def _queue(self) -> asyncio.Queue[ThreadPoolExecutor]:
        if self._free is None:
            self._free = asyncio.Queue()
            for executor in self.executors:
                self._free.put_nowait(executor)
        return self._free

    async def acquire(self) -> ThreadPoolExecutor:
        return await self._queue().get()

    def release(self, executor: ThreadPoolExecutor) -> None:
        self._queue().put_nowait(executor)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on a borrowed thread, as one request would: one hop."""
        executor = await self.acquire()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                executor, contextvars.copy_context().run, _as_request(fn), *args
            )
        finally:
            self.release(executor)

    def shutdown(self) -> None:
        """Close each thread's database connections and stop the threads."""
        for executor in self.executors:
            try:
                executor.submit(connections.close_all).result(timeout=5)
            except Exception:  # noqa: BLE001 - shutting down regardless
                pass
            executor.shutdown(wait=False)


def _as_request(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` like a request: drop stale connections before and after.

    Django's handler does the same through its request signals; for the other
    calls (the token checks) this is what does it.
    """

    def call(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return call
