"""A load run: dashboard viewers polling live tasks while two workers step them.

Everything runs as it does after ``make run``, on loopback: gunicorn's uvicorn
workers serving the ASGI application with ``pippa_site/gunicorn_conf.py``
(collected static files, whitenoise), and two
``pippa_worker`` processes stepping a pool of tasks of the 1 KiB payload tool.
Windows of equal length alternate, alone / viewers / alone / ... / alone, so a
drift in the machine's load hits both sides; worker steps/s is the number of
steps finished inside a window (their ``finished_at``) over its length, and
each side's figure is the median of its windows.

Viewers: 20 threads, each a logged-in browser tab: open a running task's page,
then poll it every 2 s the way htmx does: the page's one poller (``#live``),
its own ``hx-get`` URL as the last answer left it, ``HX-Request``/``HX-Target``
headers, the ``hx-include``d ``events_kind`` while the page shows the newest
events (the answer says whether it still does), ``If-None-Match`` when the
server sent an ETag; until the task is idle, then open the next running task.
A probe thread fetches a collected static file meanwhile, the latency
baseline.

Two runs: the payload tool, which costs nothing, so the workers are all CPU
and every viewer request takes from them (the 0.8x target; a 200-step task
lives a quarter of a second, so the viewers mostly open pages), and a paced
tool that waits ``PACED_SECONDS`` a step, as a step waiting on a brain does,
so the viewers poll tasks that are live for seconds (diagnostic rows).

Then what a user meets (``_user_level``), each figure taken while the paced
run's 20 viewers poll: the task page's and the timeline poll's p95, the
conversation list of 1,000 conversations, ``/login/`` with 200 slow or idle
sockets open against ``/login/`` without them, and the web process's memory
with 200 unfinished form bodies held by clients that never logged in.
Bounded: fixed windows, a fixed number of threads, loopback only.
"""

from __future__ import annotations

import html
import http.client
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from api.services import token_create
from bench.harness import Report
from bench.load_tools import PACED_SECONDS, load_tools_setup
from bench.peers import REPO
from bench.server import collectstatic, gunicorn, server_env
from tasks.models import Conversation, Step, Task
from tasks.plan import task_create

VIEWERS = 20
# The user-level rows' crowd: 200 sockets held open, or 200 bodies held unfinished.
HELD = 200
# /login/ with HELD slow or idle sockets open is asked in this many rounds.
SLOW_ROUNDS = 3
POLL_SECONDS = 2.0
HX_GET = re.compile(rb'id="live"[^>]*?hx-get="([^"]+)"')
EVENTS = re.compile(rb'<section id="events"')
EVENTS_LIVE = re.compile(rb'id="events-live" name="events_kind" value="([^"]*)"')
STATIC = re.compile(rb'href="(/static/[^"]+\.css)"')


class Viewers:
    """20 tabs on the dashboard, plus a probe on a static file."""

    def __init__(self, port: int, cookie: str, running: list[int]):
        self.port = port
        self.cookie = cookie
        self.running = running  # refreshed by the caller
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.pages: list[float] = []
        self.polls: list[float] = []
        # What the run is doing meanwhile (``_user_level`` sets it), and each
        # answer's time under it: {("page" or "poll", phase): [seconds]}.
        self.phase = "warm"
        self.by_phase: dict[tuple[str, str], list[float]] = {}
        self.static: list[float] = []
        self.errors: list[str] = []
        self.static_path = ""
        self.threads: list[threading.Thread] = []

    def _get(self, conn, path: str, headers: dict) -> tuple[int, bytes, dict, float]:
        started = time.perf_counter()
        conn.request("GET", path, headers={"Cookie": self.cookie, **headers})
        response = conn.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - started
        return response.status, body, dict(response.getheaders()), elapsed

    def _tab(self, n: int) -> None:
        """One request per 2 s tick: open a running task, or poll the open one."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        url, etag, events_kind = None, None, None
        self.stop.wait(random.Random(n).uniform(0, POLL_SECONDS))
        while not self.stop.is_set():
            tick = time.monotonic()
            phase = self.phase
            try:
                if url is None:
                    ids = list(self.running)
                    if ids:
                        task_id = ids[n % len(ids)]
                        status, body, _, elapsed = self._get(
                            conn, f"/tasks/{task_id}/", {}
                        )
                        if status != 200:
                            raise OSError(f"page {status}")
                        with self.lock:
                            self.pages.append(elapsed)
                            self.by_phase.setdefault(("page", phase), []).append(
                                elapsed
                            )
                        url, etag = self._poll_url(body), None
                        events_kind = self._events_kind(body)
                else:
                    headers = {"HX-Request": "true", "HX-Target": "live"}
                    if etag:
                        headers["If-None-Match"] = etag
                    path = url
                    if events_kind is not None:
                        path += "&" + urlencode({"events_kind": events_kind})
                    status, body, got, elapsed = self._get(conn, path, headers)
                    with self.lock:
                        self.polls.append(elapsed)
                        self.by_phase.setdefault(("poll", phase), []).append(elapsed)
                    if status == 200:
                        url, etag = self._poll_url(body), got.get("ETag")
                        if EVENTS.search(body):
                            events_kind = self._events_kind(body)
                    elif status == 286:
                        url = None
                    elif status not in (204, 304):
                        raise OSError(f"poll {status}")
            except (OSError, http.client.HTTPException) as exc:
                with self.lock:
                    self.errors.append(str(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                url = None
            self.stop.wait(max(0.0, POLL_SECONDS - (time.monotonic() - tick)))
        conn.close()

    @staticmethod
    def _poll_url(body: bytes) -> str | None:
        """The poller's own ``hx-get`` (absent once the task is idle)."""
        found = HX_GET.search(body)
        return html.unescape(found.group(1).decode()) if found else None

    @staticmethod
    def _events_kind(body: bytes) -> str | None:
        """The ``events_kind`` the poller includes, while the newest events show."""
        found = EVENTS_LIVE.search(body)
        return html.unescape(found.group(1).decode()) if found else None

    def _probe(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.wait(0.25):
            status, _, _, elapsed = self._get(conn, self.static_path, {})
            if status == 200:
                with self.lock:
                    self.static.append(elapsed)
        conn.close()

    def start(self, static_path: str) -> None:
        self.static_path = static_path
        self.threads = [
            threading.Thread(target=self._tab, args=(n,), daemon=True)
            for n in range(VIEWERS)
        ]
        self.threads.append(threading.Thread(target=self._probe, daemon=True))
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=35)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return found


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their live children (Linux /proc)."""
    ticks = 0
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
        todo += _children(pid)
    return ticks / os.sysconf("SC_CLK_TCK")


def _server_pids() -> list[int]:
    """The gunicorn this process started (its master; workers are found under it)."""
    return [
        pid
        for pid in _children(os.getpid())
        if "gunicorn"
        in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    ]


def _steps_between(start, end) -> int:
    return Step.objects.filter(finished_at__gte=start, finished_at__lt=end).count()


def run(report: Report) -> None:
    load_tools_setup()
    env = server_env(PIPPA_TOOLS="bench.load_tools")
    collectstatic(env)
    try:
        # The hardest case for the workers: a tool that costs nothing, so the
        # step is all our CPU and the viewers take theirs from it. A pool that
        # outlasts the windows: 120,000 steps, 30,000 quick (250 tasks ran out
        # at ~1,000 steps/s; the run says so if it happens).
        _load(report, env, tool="bench.payload", tasks=150 if report.quick else 600)
        # The common case: each step waits on the world (a brain's answer) for
        # PACED_SECONDS, so a task lives for seconds and the viewers poll it
        # live, the way Dad watches one.
        _load(report, env, tool="bench.paced", tasks=20 if report.quick else 60)
        # What a user meets, under the paced run's 20 viewers.
        _user_level(report, env, tasks=20 if report.quick else 60)
    finally:
        shutil.rmtree(settings.STATIC_ROOT, ignore_errors=True)


def _load(report: Report, env: dict, *, tool: str, tasks: int) -> None:
    """One load run: alone and viewers windows of two workers stepping ``tool``."""
    window, rounds = (6.0, 1) if report.quick else (10.0, 3)
    paced = tool == "bench.paced"
    user = get_user_model().objects.create_user(username=f"bench-load-{time.time_ns()}")
    conversation = Conversation.objects.create(owner=user, title="Load run")
    pool = [
        task_create(
            conversation=conversation,
            title=f"load {n}",
            steps=[{"title": f"s{i}", "tool": tool, "args": {}} for i in range(200)],
        ).pk
        for n in range(tasks)
    ]
    Task.objects.filter(pk__in=pool).update(status=Task.Status.PAUSED)
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"

    workers: list[subprocess.Popen] = []
    rates: dict[str, list[float]] = {"alone": [], "viewers": []}
    viewers = None
    seen = Viewers(0, "", [])  # every viewers window's requests, pooled
    server_cpu = 0.0  # gunicorn's CPU seconds while viewers were on
    served = 0  # the viewer requests it answered meanwhile
    with gunicorn(env) as port:
        server = _server_pids()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/login/")
        static_path = STATIC.search(conn.getresponse().read()).group(1).decode()
        conn.close()
        try:
            workers = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "pippa_worker",
                        "-v",
                        "0",
                        "--poll",
                        "0.1",
                        "--worker-id",
                        f"bench:load:{n}",
                    ],
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for n in range(2)
            ]
            Task.objects.filter(pk__in=pool).update(status=Task.Status.QUEUED)
            time.sleep(2.0)  # both workers up and stepping
            running: list[int] = []

            def refresh(until: float) -> None:
                while time.monotonic() < until:
                    running[:] = list(
                        Task.objects.filter(
                            pk__in=pool, status=Task.Status.RUNNING
                        ).values_list("pk", flat=True)
                    )
                    time.sleep(0.5)

            for phase in ["alone", "viewers"] * rounds + ["alone"]:
                if phase == "viewers":
                    refresh(time.monotonic() + 0.01)
                    viewers = Viewers(port, cookie, running)
                    cpu = _cpu_seconds(server)
                    viewers.start(static_path)
                    refresh(time.monotonic() + POLL_SECONDS)  # all tabs open
                start = timezone.now()
                refresh(time.monotonic() + window)
                end = timezone.now()
                rates[phase].append(
                    _steps_between(start, end) / (end - start).total_seconds()
                )
                if phase == "viewers":
                    viewers.join()
                    server_cpu += _cpu_seconds(server) - cpu
                    served += len(viewers.pages) + len(viewers.polls)
                    for name in ("pages", "polls", "static", "errors"):
                        getattr(seen, name).extend(getattr(viewers, name))
                    viewers = None
                print(f"  load: {phase}: {rates[phase][-1]:,.0f} steps/s", flush=True)
            if not Step.objects.filter(
                task_id__in=pool, finished_at__isnull=True
            ).exists():
                print("  load: the task pool ran out; rates undercount", flush=True)
        finally:
            if viewers is not None:
                viewers.join()
            for proc in workers:
                proc.terminate()
            for proc in workers:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            Task.objects.filter(pk__in=pool).update(status=Task.Status.PAUSED)

    alone = statistics.median(rates["alone"])
    waits = (
        f"steps wait {PACED_SECONDS * 1000:.0f} ms like a brain call, " if paced else ""
    )
    kind = "paced tasks; " if paced else ""
    report.add(
        group="load",
        figure=f"worker steps/s, 2 workers, {waits}{VIEWERS} "
        "viewers polling every "
        f"2 s, median of {len(rates['viewers'])} windows "
        f"({len(seen.pages)} page opens + {len(seen.polls)} polls, "
        f"{len(seen.errors)} errors)",
        value=statistics.median(rates["viewers"]),
        baseline_name=f"same 2 workers alone (median of {len(rates['alone'])} "
        "windows around them)",
        baseline=alone,
        unit="steps/s",
        higher_is_better=True,
        target="(diagnostic)" if paced else ">= 0.8 x baseline",
    )
    report.add(
        group="load",
        figure=f"server CPU per viewer request ({kind}{served} requests; gunicorn's "
        "user + system time while viewers were on, static probe included)",
        value=server_cpu / max(served, 1) * 1000,
        baseline_name="one tab's poll interval: the ratio is the share of a core "
        "each tab costs",
        baseline=POLL_SECONDS * 1000,
        unit="ms",
        higher_is_better=False,
        target="diagnostic",
    )


class Prober:
    """GET ``path`` on a fresh connection every ``period`` seconds, in a thread,
    keeping each answer's time while ``phase`` says where to keep it."""

    def __init__(self, port: int, path: str, cookie: str = "", period: float = 0.25):
        self.port, self.path, self.cookie, self.period = port, path, cookie, period
        self.phase = "warm"
        self.times: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {"Cookie": self.cookie} if self.cookie else {}
        while not self.stop.wait(self.period):
            phase = self.phase
            started = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("GET", self.path, headers=headers)
                response = conn.getresponse()
                response.read()
                conn.close()
                if response.status != 200:
                    raise OSError(f"{self.path} answered {response.status}")
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(f"{phase}: {exc}")
                continue
            self.times.setdefault(phase, []).append(time.perf_counter() - started)

    def start(self) -> Prober:
        self.thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        self.thread.join(timeout=35)


def _rss_kib(pid: int) -> int:
    """Resident memory of gunicorn's master and its workers, in KiB."""
    total = 0
    for each in [pid, *_children(pid)]:
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _slow_heads(token: str) -> list[bytes]:
    """What the slow clients send first: nothing (idle), headers that never end,
    a form body that never ends, an MCP call whose body never ends."""
    return [
        b"",
        b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: 60000\r\n\r\nusername=",
        b"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: Bearer {token}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\n"
        b"Content-Length: 100000\r\n\r\n{",
    ]


def _held_body(port: int) -> socket.socket:
    """A form POST to /login/, without logging in, all but its last bytes sent:
    as large as a client that has not signed in may send (larger is refused
    unread, ``PIPPA_MAX_ANONYMOUS_BODY_BYTES``)."""
    declared = settings.PIPPA_MAX_ANONYMOUS_BODY_BYTES
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode()
        + b"a="
        + b"x" * (declared - 102)
    )
    return sock


def _user_level(report: Report, env: dict, *, tasks: int) -> None:
    """What a user meets while the paced run's 20 viewers poll live tasks.

    One server, two workers stepping paced tasks, the viewers on throughout.
    Meanwhile: the conversation list of a user with 1,000 conversations is
    asked for every half second; /login/ every quarter second, first alone,
    then with HELD slow or idle sockets open (a quarter each: idle, trickled
    headers, trickled form bodies, trickled MCP bodies), in SLOW_ROUNDS rounds
    of new sockets; last, the web process's memory before and with HELD form
    bodies held unfinished by clients that never logged in.
    """
    from bench.bench_dashboard import _conversations

    # Long enough for about 80 page opens and 160 polls: a p95 of 40 opens
    # (the twelve seconds this was) moved by 100 ms from run to run here.
    window = 6.0 if report.quick else 24.0
    user = get_user_model().objects.create_user(username=f"bench-user-{time.time_ns()}")
    conversation = Conversation.objects.create(owner=user, title="User level")
    pool = [
        task_create(
            conversation=conversation,
            title=f"paced {n}",
            steps=[
                {"title": f"s{i}", "tool": "bench.paced", "args": {}}
                for i in range(200)
            ],
        ).pk
        for n in range(tasks)
    ]
    lister = get_user_model().objects.create_user(
        username=f"bench-list-{time.time_ns()}"
    )
    _conversations(lister, 1_000)
    cookies = {}
    for who in (user, lister):
        client = Client()
        client.force_login(who)
        cookies[who.pk] = f"sessionid={client.cookies['sessionid'].value}"
    token = token_create(user=user, name="bench user level").raw

    with gunicorn(env) as port:
        master = _server_pids()[0]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/login/")
        static_path = STATIC.search(conn.getresponse().read()).group(1).decode()
        conn.close()
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "pippa_worker",
                    "-v",
                    "0",
                    "--poll",
                    "0.1",
                    "--worker-id",
                    f"bench:user:{n}",
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for n in range(2)
        ]
        running: list[int] = []
        stop = threading.Event()

        def refresh() -> None:
            while not stop.wait(0.5):
                running[:] = list(
                    Task.objects.filter(
                        pk__in=pool, status=Task.Status.RUNNING
                    ).values_list("pk", flat=True)
                )

        refresher = threading.Thread(target=refresh, daemon=True)
        viewers = Viewers(port, cookies[user.pk], running)
        login = Prober(port, "/login/")
        listing = Prober(port, "/", cookies[lister.pk], period=0.5)
        held: list[socket.socket] = []
        try:
            Task.objects.filter(pk__in=pool).update(status=Task.Status.QUEUED)
            refresher.start()
            time.sleep(2.0)  # both workers up and stepping
            viewers.start(static_path)
            login.start()
            listing.start()
            time.sleep(POLL_SECONDS)  # every tab open
            login.phase = listing.phase = viewers.phase = "viewers"
            time.sleep(window)

            heads = _slow_heads(token)

            def trickle() -> None:
                while not stop.wait(1.0):
                    for n, sock in enumerate(list(held)):
                        if n % len(heads):
                            try:
                                sock.sendall(b"a")
                            except OSError:
                                pass

            threading.Thread(target=trickle, daemon=True).start()
            # Rounds of HELD new sockets, each shorter than the head deadline
            # (10 s), as many /login/ answers as without them (one round gave
            # about 31, and its p95 was its second slowest).
            for _ in range(SLOW_ROUNDS):
                login.phase = listing.phase = viewers.phase = "opening"
                for n in range(HELD):
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    if heads[n % len(heads)]:
                        sock.sendall(heads[n % len(heads)])
                    held.append(sock)
                login.phase = listing.phase = viewers.phase = "slow sockets"
                time.sleep(min(window / SLOW_ROUNDS, 8.0))
                login.phase = listing.phase = viewers.phase = "after"
                for sock in held:
                    sock.close()
                held.clear()

            time.sleep(2.0)
            idle_rss = _rss_kib(master)
            login.phase = listing.phase = viewers.phase = "held bodies"
            with ThreadPoolExecutor(20) as senders:
                held = list(senders.map(lambda _: _held_body(port), range(HELD)))
            time.sleep(5.0)  # the server takes in what they sent
            held_rss = _rss_kib(master)
        finally:
            stop.set()
            for sock in held:
                sock.close()
            for each in (login, listing):
                each.join()
            viewers.join()
            for proc in workers:
                proc.terminate()
            for proc in workers:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            refresher.join(timeout=5)
            Task.objects.filter(pk__in=pool).update(status=Task.Status.PAUSED)

    crowd = f"under {VIEWERS} viewers polling paced tasks"
    held_kib = settings.PIPPA_MAX_ANONYMOUS_BODY_BYTES // 1024
    within = partial(
        report.add,
        group="user",
        baseline_name="target",
        unit="ms",
        higher_is_better=False,
        target="<= 1.0 x baseline",
    )
    # The viewers alone: the three pages' rows. While the server takes in held
    # bodies (the memory row's attack), the same pages get rows of their own.
    pages = viewers.by_phase.get(("page", "viewers"), [])
    polls = viewers.by_phase.get(("poll", "viewers"), [])
    lists = listing.times.get("viewers", [])
    within(
        figure=f"task page p95, {crowd} ({len(pages)} opens, "
        f"{len(viewers.errors)} errors in the whole run)",
        value=_pct(pages, 0.95),
        baseline=100,
    )
    within(
        figure=f"timeline poll p95, {crowd} ({len(polls)} polls)",
        value=_pct(polls, 0.95),
        baseline=50,
    )
    within(
        figure=f"conversation list of 1,000 p95, {crowd} ({len(lists)} requests, "
        f"{len(listing.errors)} errors in the whole run)",
        value=_pct(lists, 0.95),
        baseline=100,
    )
    held_crowd = f"{crowd}, while {HELD} form bodies of {held_kib} KiB are held"
    for figure, times in [
        ("task page p95", viewers.by_phase.get(("page", "held bodies"), [])),
        ("timeline poll p95", viewers.by_phase.get(("poll", "held bodies"), [])),
        ("conversation list p95", listing.times.get("held bodies", [])),
    ]:
        report.add(
            group="user",
            figure=f"{figure}, {held_crowd} ({len(times)} requests)",
            value=_pct(times, 0.95),
            baseline_name="diagnostic",
            baseline=_pct(times, 0.50),
            unit="ms",
            higher_is_better=False,
            target="diagnostic (baseline: the median)",
        )
    held_login = login.times.get("held bodies", [])
    within(
        figure=f"/login/ slowest answer, {held_crowd} ({len(held_login)} requests)",
        value=max(held_login, default=float("nan")) * 1000,
        baseline=1000,
    )
    slow = login.times.get("slow sockets", [])
    idle = login.times.get("viewers", [])
    report.add(
        group="user",
        figure=f"/login/ p95 with {HELD} slow or idle sockets open, {crowd} "
        f"({len(slow)} requests, {len(login.errors)} errors)",
        value=_pct(slow, 0.95),
        baseline_name=f"/login/ p95 without them ({len(idle)} requests)",
        baseline=_pct(idle, 0.95),
        unit="ms",
        higher_is_better=False,
        target="<= 2.0 x baseline",
    )
    report.add(
        group="user",
        figure=f"web process memory with {HELD} form bodies of {held_kib} KiB held "
        f"unfinished before login, {crowd}",
        value=held_rss / 1024,
        baseline_name="the same process just before",
        baseline=idle_rss / 1024,
        unit="MiB",
        higher_is_better=False,
        target="<= 1.5 x baseline",
    )
