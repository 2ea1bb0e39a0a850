"""The site's ASGI application under a real uvicorn, for tests.

``ThreadedServer`` runs uvicorn in a thread of the test process, on a free
loopback port, with the settings ``make run`` gives its workers
(``pippa_site.gunicorn_conf.PippaUvicornWorker.CONFIG_KWARGS``): it sees the
test's database (use ``transactional_db``), settings and tools, and a test can
look at the server's event loop (its tasks) and threads. ``tests/test_serving.py``
also runs the real gunicorn in a process of its own.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from pippa_site.gunicorn_conf import PippaUvicornWorker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadedServer:
    """uvicorn serving ``pippa_site.asgi.application`` in a background thread."""

    def __init__(self, **config: Any) -> None:
        from pippa_site.asgi import Site

        self.port = free_port()
        self.app = Site()
        kwargs = {
            **PippaUvicornWorker.CONFIG_KWARGS,
            "timeout_keep_alive": 5,
            "log_level": "warning",
            **config,
        }
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, **kwargs)
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            # Background tasks of the libraries (sse-starlette's shutdown
            # watcher) end with the loop.
            leftover = asyncio.all_tasks(self.loop)
            for task in leftover:
                task.cancel()
            self.loop.run_until_complete(
                asyncio.gather(*leftover, return_exceptions=True)
            )
            self.loop.close()

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def tasks(self) -> list[asyncio.Task]:
        """The tasks alive on the server's event loop, uvicorn's own included."""
        assert self.loop is not None
        future = asyncio.run_coroutine_threadsafe(_all_tasks(), self.loop)
        return future.result(timeout=10)


async def _all_tasks() -> list[asyncio.Task]:
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current]
