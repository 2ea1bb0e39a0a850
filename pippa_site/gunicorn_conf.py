"""gunicorn settings for ``make run``: ``gunicorn -c python:pippa_site.gunicorn_conf``.

Threaded workers (gthread): a live task page polls every 2 s, and a handful of
tabs must not queue behind one slow page. Request bodies are never read ahead
by gunicorn: Django reads what a view asks for (bounded by
DATA_UPLOAD_MAX_MEMORY_SIZE, and the API's streamed upload by
PIPPA_MAX_UPLOAD_BYTES), and a body a view left unread is not buffered; the
connection is closed instead. Headers and the request line are bounded here.
"""

from __future__ import annotations

import os


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


bind = [f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"]
wsgi_app = "pippa_site.wsgi:application"
worker_class = "gthread"
# One process per two cores, eight threads each. The machine also runs the
# step workers, and a web process (one GIL) never takes more than one core from
# them; threads carry the concurrency of many tabs polling. On 2 cores, in two
# consecutive load runs, 1 x 8 kept the workers at 0.97x their speed alone
# under 20 polling tabs, 2 x 4 at 0.59x (a ratio the machine's load moves a
# lot: docs/serving-and-bench.md).
workers = _int("PIPPA_WEB_WORKERS", max(1, (os.cpu_count() or 2) // 2))
threads = _int("PIPPA_WEB_THREADS", 8)
# A page is milliseconds; a streamed upload of 256 MiB on a slow link is not.
timeout = _int("PIPPA_WEB_TIMEOUT", 120)
graceful_timeout = 20
keepalive = 5
# Recycle workers now and then so slow leaks cannot pile up.
max_requests = 5000
max_requests_jitter = 500
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190
# Two servers on one machine (tests, a second checkout) must not share a
# control socket in $HOME; nothing here uses gunicornc.
control_socket_disable = True
accesslog = os.environ.get("PIPPA_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("PIPPA_WEB_LOG_LEVEL", "warning")
