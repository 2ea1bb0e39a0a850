"""gunicorn settings for ``make run``: ``gunicorn -c python:pippa_site.gunicorn_conf``.

gunicorn manages the processes (start, restart on a crash or after
``max_requests``, graceful stop); each worker is uvicorn (``uvicorn-worker``)
serving the ASGI application ``pippa_site.asgi``: Django's own handler, and
the MCP SDK's streamable HTTP app at ``/mcp/``. A connection is a coroutine
on the worker's event loop, not a thread, and every phase a client controls
has a deadline (``pippa_site.shedding``: the request head, the body, reading
the answer), with a cap on open connections. Django runs each request's
synchronous code on a thread of its own while it runs, one of those the site
keeps for Django's requests (``pippa_site.request_threads``).
docs/serving-and-bench.md says more.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource

from uvicorn_worker import UvicornWorker

from pippa_site.shedding import FILES_KEPT, connection_cap


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


class PippaUvicornWorker(UvicornWorker):
    """uvicorn with the site's bounds."""

    CONFIG_KWARGS = {
        "loop": "asyncio",
        # h11, with the deadlines and the connection cap uvicorn lacks; the
        # request line and headers together are bounded (16 KiB; more is a
        # 400 and the connection closes).
        "http": "pippa_site.shedding:Protocol",
        "h11_max_incomplete_event_size": 16 * 1024,
        # The lifespan starts the MCP session manager.
        "lifespan": "on",
        # The client's address is the socket's: X-Forwarded-For counts only
        # with PIPPA_BEHIND_PROXY (pippa_site.throttle.client_ip), never
        # because a local client sent one.
        "proxy_headers": False,
        "server_header": False,
        "date_header": True,
        "timeout_graceful_shutdown": 20,
    }


def _raise_file_limit() -> int:
    """Raise this process's file limit (and its workers') to what the system
    allows; return it. Each open connection is a file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    return soft


_files = _raise_file_limit()
# Connections waiting to be accepted; also how many the event loop accepts in
# one go before the connection cap (pippa_site.shedding) sees them (it may take
# three such batches), so three stay within what the file limit leaves beside
# the cap: a burst of idle sockets must not use up the files before the oldest
# are shed.
backlog = min(2048, max(16, (_files - FILES_KEPT - connection_cap(10**6)) // 4))
bind = [f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"]
wsgi_app = "pippa_site.asgi:application"
worker_class = "pippa_site.gunicorn_conf.PippaUvicornWorker"
# One process per core. Each process has one interpreter lock, so its requests
# take turns on one core however many threads it runs: on 2 cores, under the
# load bench's 20 viewers with two step workers stepping, one process answered
# the task page at a p95 of 136 ms and the live poll at 127; two, in six runs,
# at 79 to 145 and 60 to 90 (/login/ at 13 to 23 ms), and the workers kept 0.93
# to 0.96 of their steps (docs/serving-and-bench.md). The bounds on calls in
# flight hold for all of a host's processes together (pippa_site/slots.py); MCP
# over HTTP is stateless, so any process answers any call.
workers = _int("PIPPA_WEB_WORKERS", os.cpu_count() or 1)
# The heartbeat: a worker whose event loop stops answering for this long is
# restarted. Views run on threads, so a slow page or upload does not count.
timeout = _int("PIPPA_WEB_TIMEOUT", 60)
graceful_timeout = 20
# Idle keep-alive connections close after this many seconds (a request head
# begun meanwhile has PIPPA_HEAD_SECONDS from the last answer).
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
    """Give large buffers back (``_return_large_buffers``), then freeze the
    loaded modules (``_freeze``)."""
    _return_large_buffers()
    _freeze()


# glibc's mallopt(3) parameter: allocations at least this large are mapped
# from the system and given back to it when freed.
M_MMAP_THRESHOLD = -3
LARGE_BUFFER_BYTES = 128 * 1024


def _return_large_buffers() -> None:
    """Give large buffers back to the system as soon as they are freed.

    A socket read is a buffer of up to 256 KiB; when many clients send bodies
    at once, the event loop holds one per connection for a moment. glibc maps
    such a buffer on its own and unmaps it when freed, but its threshold for
    doing so grows to the largest buffer freed, after which they come from the
    heap and the burst's memory stays with the process. Fixing the threshold
    (glibc's documented ``mallopt``) keeps it from growing. A C library
    without ``mallopt`` is left as it is.
    """
    try:
        # The process's own symbols: the C library it runs on.
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES)
    except (OSError, AttributeError):
        pass


def _freeze() -> None:
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
