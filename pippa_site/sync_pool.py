"""A fixed pool of threads for Django's synchronous code under the ASGI server.

Django's ASGI handler runs a request's middleware and view (and the signals
around them) in one thread per request: by default a thread of its own, made
and dropped per request, with a database connection opened and left behind
each time. This pool keeps ``PIPPA_WEB_THREADS`` single-thread executors
instead. A request borrows one only once its body is in (a client trickling a
body holds no thread) and gives it back before its answer is sent (a client
reading slowly holds none either); meanwhile every thread-sensitive call of the
request runs on that one thread (``asgiref.sync.ThreadSensitiveContext`` with an
executor). Each thread keeps its database connection between requests
(``CONN_MAX_AGE``), as the threaded WSGI server did. A request waiting for a
thread is a coroutine, not a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
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
        """Run ``fn(*args)`` on a borrowed thread, as one request would."""
        lease = Lease(self)
        try:
            await lease.enter()
            return await sync_to_async(_as_request(fn), thread_sensitive=True)(*args)
        finally:
            await lease.exit()

    def shutdown(self) -> None:
        """Close each thread's database connections and stop the threads."""
        for executor in self.executors:
            try:
                executor.submit(connections.close_all).result(timeout=5)
            except Exception:  # noqa: BLE001 - shutting down regardless
                pass
            executor.shutdown(wait=False)


class Lease:
    """One request's hold on a pool thread: entered once, left once."""

    def __init__(self, pool: SyncPool) -> None:
        self.pool = pool
        self.executor: ThreadPoolExecutor | None = None
        self.context: ThreadSensitiveContext | None = None

    async def enter(self) -> None:
        self.executor = await self.pool.acquire()
        self.context = ThreadSensitiveContext(executor=self.executor)
        await self.context.__aenter__()

    async def exit(self) -> None:
        context, executor = self.context, self.executor
        self.context = self.executor = None
        if context is not None:
            await context.__aexit__(None, None, None)
        if executor is not None:
            self.pool.release(executor)


def _as_request(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` like a request: drop stale connections before and after."""

    def call(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return call
