"""Threads for Django's requests in a web process, each used again by later
requests (``RequestThreads``)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager

from asgiref.sync import ThreadSensitiveContext
from django.db import connections


class OneThread(ThreadPoolExecutor):
    """An executor of one thread (started at its first call), which says
    whether it was ever called (``used``: one never called has no thread and
    no database connection to close) and whether a call is still running
    (``busy``: it runs its calls in order, so the last one tells)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="django")
        self.last: Future | None = None

    @property
    def used(self) -> bool:
        return self.last is not None

    @property
    def busy(self) -> bool:
        return self.last is not None and not self.last.done()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        self.last = super().submit(fn, *args, **kwargs)
        return self.last


class RequestThreads:
    """Threads for Django's requests, each used again by later requests.

    Django's handler runs a request's middleware and view on the executor of
    its ``ThreadSensitiveContext``; left to itself it makes one per request: a
    thread started, another to join it, and a database connection opened and
    closed, every request. asgiref lets the caller give that context an
    executor of its own, to be "used again for a later block, for example in
    a pool" (its README); Django's own context inside it then uses the same.
    So a request takes an idle executor here, or a new one, and gives it back
    when its answer is sent. Its thread keeps its database connection between
    requests (``CONN_MAX_AGE``, checked by Django at each request's start and
    end), as a WSGI server's threads do.

    At most ``idle`` executors wait for a request; one more is let go, its
    database connections closed on its own thread. An executor whose request
    ended in an error, or whose thread is still running a call, is let go
    too: when a client leaves mid-view, Django's handler stops waiting and
    returns, but the view runs on to its end, and the next request must not
    queue behind it.
    """

    def __init__(self, idle: int) -> None:
        self.idle = idle
        self.free: list[OneThread] = []

    @asynccontextmanager
    async def __call__(self):
        executor = self.free.pop() if self.free else OneThread()
        try:
            async with ThreadSensitiveContext(executor=executor):
                yield
        except BaseException:
            self._let_go(executor)
            raise
        if len(self.free) < self.idle and not executor.busy:
            self.free.append(executor)
        else:
            self._let_go(executor)

    async def close(self) -> None:
        """Let every idle executor go and wait for their threads to end (the
        server stops: their database connections are closed)."""
        free, self.free = self.free, []
        for executor in free:
            self._let_go(executor)
        for executor in free:
            await asyncio.to_thread(executor.shutdown)

    @staticmethod
    def _let_go(executor: OneThread) -> None:
        if executor.used:
            executor.submit(connections.close_all)
        executor.shutdown(wait=False)
