"""gunicorn settings for ``make run``: ``gunicorn -c python:pippa_site.gunicorn_conf``.

gunicorn manages the processes (start, restart on a crash or after
``max_requests``, graceful stop); each worker is uvicorn (``uvicorn-worker``)
serving the ASGI application ``pippa_site.asgi``: Django, and the MCP SDK's
streamable HTTP app at ``/mcp/``. A connection is a coroutine on the worker's
event loop, not a thread: a client that trickles its headers or body, or
holds a stream open, ties up nothing another client needs. Django's views run
on ``PIPPA_WEB_THREADS`` threads per process (``pippa_site.sync_pool``), each
borrowed only while a view runs. docs/serving-and-bench.md says why.
"""

from __future__ import annotations

import gc
import os

from uvicorn_worker import UvicornWorker


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


class PippaUvicornWorker(UvicornWorker):
    """uvicorn with the site's bounds."""

    CONFIG_KWARGS = {
        "loop": "asyncio",
        # h11: the request line and headers together are bounded (16 KiB; more
        # is a 400 and the connection closes).
        "http": "h11",
        "h11_max_incomplete_event_size": 16 * 1024,
        # The lifespan starts the MCP session manager and the thread pool.
        "lifespan": "on",
        # The client's address is the socket's: X-Forwarded-For counts only
        # with PIPPA_BEHIND_PROXY (pippa_site.throttle.client_ip), never
        # because a local client sent one.
        "proxy_headers": False,
        "server_header": False,
        "date_header": True,
        "timeout_graceful_shutdown": 20,
    }


bind = [f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"]
wsgi_app = "pippa_site.asgi:application"
worker_class = "pippa_site.gunicorn_conf.PippaUvicornWorker"
# One process per two cores. The machine also runs the step workers, and a web
# process (one GIL) never takes more than one core from them; its threads and
# its event loop carry the concurrency of many tabs polling.
workers = _int("PIPPA_WEB_WORKERS", max(1, (os.cpu_count() or 2) // 2))
# The heartbeat: a worker whose event loop stops answering for this long is
# restarted. Views run on threads, so a slow page or upload does not count.
timeout = _int("PIPPA_WEB_TIMEOUT", 60)
graceful_timeout = 20
# Idle keep-alive connections close after this many seconds.
keepalive = 5
# Recycle workers now and then so slow leaks cannot pile up.
max_requests = 5000
max_requests_jitter = 500
# Two servers on one machine (tests, a second checkout) must not share a
# control socket in $HOME; nothing here uses gunicornc.
control_socket_disable = True
accesslog = os.environ.get("PIPPA_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("PIPPA_WEB_LOG_LEVEL", "warning")


def post_worker_init(worker) -> None:
    """Take what the worker has loaded (Django, the site's modules, settings)
    out of the garbage collector's sight once, before the first request.

    Left in, the collector walks it again and again: in one paced load run
    the worker's two full collections took 89 and 116 ms and its 30-odd
    middle ones 4-9 ms each, a request waiting behind each; frozen, the task
    page's p95 under that load went from 70-82 ms to 52-56
    (docs/serving-and-bench.md).
    """
    gc.collect()
    gc.freeze()
