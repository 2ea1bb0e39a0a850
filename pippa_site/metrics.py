"""What the processes of a host count, for an operator's Prometheus.

The metrics are prometheus-client's. Every web and worker process of a host
writes its counters and histograms to its own files in one folder
(``PROMETHEUS_MULTIPROC_DIR``, which the settings point at
``PIPPA_METRICS_DIR``: prometheus-client's multiprocess mode), and a scrape
adds them up (``exposition``), with what the database says at that moment
(tasks by status, the queue, the outbox, the blob store's bytes: collectors
the scrape view passes in, ``api.metrics``). ``docs/metrics.md`` lists them
with what to watch.

The rule for a caller: a metric records what has happened, after the durable
write it counts, never in place of one or before it (a step's counters after
its commits, a put's after the store acknowledged it, a takeover's on its
transaction's commit). Nothing here touches the database.

The helpers below are the only writers; each one is a few microseconds (an
mmapped file write under a lock).
"""

from __future__ import annotations

import glob
import hmac
import os
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

# Seconds: from a page's few milliseconds to a long tool call.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
PUT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

STEPS_STARTED = Counter(
    "pippa_steps_started",
    "Tool calls started (tool_call_started committed), by artifact class.",
    ["artifact_class"],
)
STEPS_FINISHED = Counter(
    "pippa_steps_finished",
    "Steps run to an outcome: done, retry (the tool failed, tried again later), "
    "failed, needs_review (waiting for a person), unsaved (the output could not "
    "be stored yet).",
    ["artifact_class", "outcome"],
)
STEP_SECONDS = Histogram(
    "pippa_step_seconds",
    "Time of one step, lease to result commit, by artifact class.",
    ["artifact_class"],
    buckets=STEP_BUCKETS,
)
TOOL_FAILURES = Counter(
    "pippa_tool_failures",
    "Tool calls that raised or returned nothing usable.",
    ["tool"],
)
LEASE_TAKEOVERS = Counter(
    "pippa_lease_takeovers", "Leases taken over from a worker that stopped renewing."
)
UNCERTAIN_STEPS = Counter(
    "pippa_uncertain_steps",
    "Open envelopes settled by their class, by rule (tasks.resume).",
    ["rule"],
)
NOTIFICATIONS = Counter(
    "pippa_notifications", "Notification messages by result: sent, failed.", ["result"]
)
BLOB_PUTS = Counter(
    "pippa_blob_puts",
    "Blob writes acknowledged, by store and whether the bytes were new.",
    ["store", "result"],
)
BLOB_PUT_BYTES = Counter(
    "pippa_blob_put_bytes", "Bytes of blob writes acknowledged.", ["store"]
)
BLOB_PUT_SECONDS = Histogram(
    "pippa_blob_put_seconds",
    "Time of one blob write until the store acknowledged it.",
    ["store"],
    buckets=PUT_BUCKETS,
)
BLOB_PUT_ERRORS = Counter(
    "pippa_blob_put_errors", "Blob writes the store failed (not refusals).", ["store"]
)
REQUEST_SECONDS = Histogram(
    "pippa_request_seconds",
    "Time to answer a request, by door (dashboard, admin, api, mcp) and status class.",
    ["door", "status"],
    buckets=REQUEST_BUCKETS,
)

# The outcome label of a step, from its status after the call.
OUTCOMES = {
    "done": "done",
    "pending": "retry",
    "failed": "failed",
    "needs_review": "needs_review",
    "running": "unsaved",
}


def step_observed(
    *,
    artifact_class: int,
    tool: str,
    status: str,
    invoked: bool,
    rule: str,
    seconds: float,
    tool_failed: bool,
) -> None:
    """Count one step the executor has finished writing (after its commits)."""
    label = str(artifact_class)
    if invoked:
        STEPS_STARTED.labels(label).inc()
    if tool_failed:
        TOOL_FAILURES.labels(tool).inc()
    if rule:
        UNCERTAIN_STEPS.labels(rule).inc()
    outcome = OUTCOMES.get(status)
    if outcome is not None and (invoked or rule):
        STEPS_FINISHED.labels(label, outcome).inc()
        STEP_SECONDS.labels(label).observe(seconds)


def lease_taken_over() -> None:
    LEASE_TAKEOVERS.inc()


def notifications_observed(*, sent: int, failed: int) -> None:
    """Count messages of a delivery round, once each one's state is written."""
    if sent:
        NOTIFICATIONS.labels("sent").inc(sent)
    if failed:
        NOTIFICATIONS.labels("failed").inc(failed)


def blob_put_done(store: str, seconds: float, size: int, created: bool) -> None:
    BLOB_PUTS.labels(store, "stored" if created else "deduplicated").inc()
    BLOB_PUT_BYTES.labels(store).inc(size)
    BLOB_PUT_SECONDS.labels(store).observe(seconds)


def blob_put_failed(store: str) -> None:
    BLOB_PUT_ERRORS.labels(store).inc()


def request_observed(*, door: str, status: int, seconds: float) -> None:
    REQUEST_SECONDS.labels(door, f"{status // 100}xx").observe(seconds)


def multiprocess_dir() -> str | None:
    """The host's folder of counters a scrape adds up (``PIPPA_METRICS_DIR``)."""
    from django.conf import settings

    path = str(getattr(settings, "PIPPA_METRICS_DIR", "")) or os.environ.get(
        "PROMETHEUS_MULTIPROC_DIR", ""
    )
    return path if path and os.path.isdir(path) else None


def exposition(*collectors) -> tuple[bytes, str]:
    """The text a scrape reads: every process of this host, plus ``collectors``
    (read at this moment). Return (body, content type)."""
    registry = CollectorRegistry(auto_describe=True)
    path = multiprocess_dir()
    if path is not None:
        registry.register(_HostFiles(path))
    else:
        registry.register(_ThisProcess())
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _HostFiles:
    """prometheus-client's multiprocess merge over the host's files that hold
    something. A process creates its file before it sizes it, so a scrape in
    that moment finds an empty file, and one killed in it leaves that file for
    good; the library's own collector then fails every scrape on it
    (prometheus/client_python#1199). An empty file has recorded nothing: it is
    passed over, and the other processes' counts are still read."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self):
        files = []
        for name in glob.glob(os.path.join(self.path, "*.db")):
            # A file removed since the glob (`make run` empties the folder)
            # holds nothing either.
            try:
                if os.path.getsize(name) > 0:
                    files.append(name)
            except FileNotFoundError:
                continue
        return MultiProcessCollector.merge(files, accumulate=True)


class _ThisProcess:
    """This process's own metrics, where no multiprocess folder is set."""

    def collect(self):
        yield from REGISTRY.collect()


def token_matches(authorization: str, expected: str) -> bool:
    """Whether an ``Authorization`` header carries the scrape token
    (``PIPPA_METRICS_TOKEN``), compared in constant time; never with none set."""
    scheme, _, raw = authorization.partition(" ")
    if not expected or scheme.lower() != "bearer" or not raw.strip():
        return False
    return hmac.compare_digest(raw.strip().encode(), expected.encode())


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # a scrape every few seconds: no log line
        pass


def serve(*, address: str, port: int, token: str) -> WSGIServer:
    """Serve this host's counters at ``http://address:port/metrics`` to a
    scraper with the token, from a daemon thread: the exporter of a host
    that runs workers and no web process (``pippa_worker --metrics-port``).
    The database's gauges are any web host's to serve."""

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        if not token_matches(environ.get("HTTP_AUTHORIZATION", ""), token):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"metrics are for a scraper with PIPPA_METRICS_TOKEN\n"]
        body, content_type = exposition()
        start_response("200 OK", [("Content-Type", content_type)])
        return [body]

    server = make_server(address, port, app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
