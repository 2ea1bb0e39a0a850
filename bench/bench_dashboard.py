"""Dashboard pages at scale, each beside a trivial Django view in the same run.

Figures: the task page of a task with 10,000 steps and 100,000 events, its
htmx timeline poll, and the conversation list with 1,000 conversations —
median render time through the whole middleware stack (session, auth, CSRF,
CSP, htmx) and the number of queries. The baseline is a view that returns a
constant through the same stack, so the ratio is the dashboard's own cost.

The timeline is paginated (100 steps a page, opening at the current step).
The "whole timeline on one page" row shows why: rendering every row scales
with the plan's length, while a page costs the same at step 10 or 10,000.

A page's settled rows are drawn once per server process and then kept
(``dashboard.rowcache``), so the other task page rows time pages whose rows
are kept. The "first open" row draws a running task's page with none kept
yet, as the first tab to open a task in a process does (the task page's
tail under the load run's viewers, ``bench_load``, is those opens).

This module doubles as the URLconf of the run (the site's URLs plus the
trivial view), so the baseline goes through exactly the same middleware.
"""

from __future__ import annotations

import html
import re
import time
from datetime import timedelta
from functools import partial

from django.contrib.auth import get_user_model
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import include, path
from django.utils import timezone

from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from bench.bench_executor import _make_tasks, tool_setup
from bench.harness import Report, interleaved_ms, median_ms
from dashboard import rowcache
from dashboard.selectors import timeline
from tasks.executor import step
from tasks.models import Conversation, Event, Step, Task, TaskArtifact


def trivial(request):
    # Touch the user so the baseline pays for the session and user lookups too.
    return HttpResponse("ok" if request.user.is_authenticated else "anonymous")


urlpatterns = [
    path("bench-trivial/", trivial),
    path("", include("pippa_site.urls")),
]

KINDS = [
    "tool_call_started",
    "payload_persisted",
    "tool_result_persisted",
    "lease_renewed",
]


def _task_with(conversation, *, steps: int, events: int, outputs: int) -> Task:
    """A running task whose first half of steps is done, with text outputs."""
    done = steps // 2 + min(50, steps // 4)
    task = Task.objects.create(
        conversation=conversation,
        title=f"Bench task, {steps} steps",
        status=Task.Status.RUNNING,
        brain="claude",
        lease_owner="worker:bench",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
        steps_total=steps,
        steps_done=done,
        last_seq=events,
    )
    artifacts = [
        artifact_store(
            owner=conversation.owner_id,
            data=(f"row {i}: " + "price,volume\n" * 40).encode(),
            media_type="text/csv",
            artifact_class=ArtifactClass.FETCH,
            title=f"bench output {task.pk}-{i}",
        )
        for i in range(outputs)
    ]
    now = timezone.now()
    Step.objects.bulk_create(
        [
            Step(
                task=task,
                position=n,
                title=f"Fetch page {n}",
                tool="daily_closes",
                artifact_class=ArtifactClass.FETCH,
                status=Step.Status.DONE if n <= done else Step.Status.PENDING,
                attempts=1 if n <= done else 0,
                output=artifacts[n % outputs] if n <= done else None,
                started_at=now if n <= done else None,
                finished_at=now if n <= done else None,
            )
            for n in range(1, steps + 1)
        ],
        batch_size=2000,
    )
    TaskArtifact.objects.bulk_create(
        [TaskArtifact(task=task, artifact=a) for a in artifacts]
    )
    step_ids = list(
        Step.objects.filter(task=task).order_by("position").values_list("pk", flat=True)
    )
    batch = []
    for seq in range(1, events + 1):
        batch.append(
            Event(
                task=task,
                step_id=step_ids[(seq // 10) % len(step_ids)],
                seq=seq,
                kind=KINDS[seq % len(KINDS)],
                data={"n": seq},
                created_at=now,
            )
        )
        if len(batch) == 5000:
            Event.objects.bulk_create(batch)
            batch = []
    Event.objects.bulk_create(batch)
    return task


def _running_task(conversation, *, steps: int, done: int) -> Task:
    """A task the executor has stepped ``done`` times: real events, outputs
    in files, a live lease."""
    tool_setup()
    [task_id] = _make_tasks(conversation, steps)
    for _ in range(done):
        step(task_id=task_id, worker_id="bench:dashboard")
    return Task.objects.get(pk=task_id)


def _conversations(owner, count: int) -> None:
    rows = Conversation.objects.bulk_create(
        [Conversation(owner=owner, title=f"Conversation {i}") for i in range(count)],
        batch_size=1000,
    )
    Task.objects.bulk_create(
        [
            Task(
                conversation=c,
                title=f"Task {j} of {c.title}",
                status=[Task.Status.DONE, Task.Status.RUNNING][j],
                steps_total=10,
                steps_done=10 - 5 * j,
            )
            for c in rows
            for j in range(2)
        ],
        batch_size=2000,
    )


def _measure(client: Client, url: str, repeat: int, **headers) -> tuple[float, int]:
    """Median wall time in ms of GET url, and the query count of one GET."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, headers=headers)
    # Read the count now: the next request clears the connection's query log.
    queries = len(ctx.captured_queries)
    assert response.status_code == 200, (url, response.status_code)
    return median_ms(lambda: client.get(url, headers=headers), repeat), queries


def run(report: Report) -> None:
    quick = report.quick
    steps, events, conversations = (
        (1_000, 10_000, 200) if quick else (10_000, 100_000, 1_000)
    )
    repeat = 5 if quick else 15
    with override_settings(
        ROOT_URLCONF="bench.bench_dashboard",
        ALLOWED_HOSTS=["testserver"],
        DEBUG=False,
    ):
        User = get_user_model()
        dad = User.objects.create_user(username=f"bench-dad-{time.time_ns()}")
        home = Conversation.objects.create(owner=dad, title="Bench home")
        big = _task_with(home, steps=steps, events=events, outputs=100)
        small = _task_with(home, steps=10, events=10, outputs=5)
        lister = User.objects.create_user(username=f"bench-list-{time.time_ns()}")
        _conversations(lister, conversations)

        client = Client()
        client.force_login(dad)
        base_ms, base_q = _measure(client, "/bench-trivial/", repeat * 4)
        # A time in ms beside the trivial view's (lower is better).
        beside_trivial = partial(
            report.add,
            group="dashboard",
            baseline_name="trivial logged-in view",
            baseline=base_ms,
            unit="ms",
            higher_is_better=False,
        )

        ms, q = _measure(client, big.get_absolute_url(), repeat)
        _, small_q = _measure(client, small.get_absolute_url(), 1)
        label = f"{steps:,} steps, {events:,} events"
        beside_trivial(
            figure=f"task page ({label}): median render",
            value=ms,
            target="< 300 ms",
        )
        report.add(
            group="dashboard",
            figure=f"task page ({label}): queries",
            value=q,
            baseline_name="task page, 10 steps / 10 events",
            baseline=small_q,
            unit="queries",
            higher_is_better=False,
            target="= baseline",
        )
        # A running task's page opened first in this process (no row kept
        # yet), beside the same page opened again, in turns.
        running = _running_task(home, steps=200, done=60)
        url = running.get_absolute_url()
        assert client.get(url).status_code == 200
        first = interleaved_ms(
            {
                "first": lambda: (rowcache.clear(), client.get(url)),
                "again": lambda: client.get(url),
            },
            repeat * 2,
            warmup=1,
        )
        report.add(
            group="dashboard",
            figure="task page of a running task, first open in the process "
            "(200 steps, 60 done by the executor: no row drawn yet)",
            value=first["first"],
            baseline_name="the same page again (its settled rows kept)",
            baseline=first["again"],
            unit="ms",
            higher_is_better=False,
            target="(diagnostic)",
        )
        poll_ms, poll_q = _measure(
            client,
            big.get_absolute_url(),
            repeat,
            **{"HX-Request": "true", "HX-Target": "timeline"},
        )
        beside_trivial(
            figure=f"timeline htmx poll ({poll_q} queries)",
            value=poll_ms,
            target="< 200 ms",
        )
        # The poll the page itself sets up (its #live hx-get, with the
        # hx-include'd events filter), sent again while nothing happened: what
        # every open tab costs every 2 s.
        page = client.get(big.get_absolute_url()).content
        found = re.search(rb'id="live"[^>]*?hx-get="([^"]+)"', page)
        idle_url = html.unescape(found.group(1).decode())
        if re.search(rb'id="events-live" name="events_kind" value=""', page):
            idle_url += "&events_kind="
        idle_headers = {"HX-Request": "true", "HX-Target": "live"}
        first = client.get(idle_url, headers=idle_headers)
        if first.has_header("ETag"):
            idle_headers["If-None-Match"] = first["ETag"]
        with CaptureQueriesContext(connection) as ctx:
            idle = client.get(idle_url, headers=idle_headers)
        idle_q = len(ctx.captured_queries)
        idle_ms = median_ms(
            lambda: client.get(idle_url, headers=idle_headers), repeat * 4
        )
        beside_trivial(
            figure=f"idle poll of a live task, nothing changed "
            f"({idle.status_code}, {len(idle.content):,} B, {idle_q} queries)",
            value=idle_ms,
            target="<= 2.0 x baseline",
        )
        older = big.get_absolute_url() + f"?before={events // 2}&kind=lease_renewed"
        deep_ms, _ = _measure(client, older, repeat)
        beside_trivial(
            figure="task page, events filtered by kind, mid-log page",
            value=deep_ms,
        )

        saved = timeline.STEPS_PER_PAGE
        timeline.STEPS_PER_PAGE = steps
        try:
            whole_ms, _ = _measure(client, big.get_absolute_url(), 3)
        finally:
            timeline.STEPS_PER_PAGE = saved
        report.add(
            group="dashboard",
            figure=f"whole {steps:,}-step timeline on one page (not shipped)",
            value=whole_ms,
            baseline_name="paginated task page",
            baseline=ms,
            unit="ms",
            higher_is_better=False,
            note="why the timeline is paginated",
        )

        client.force_login(lister)
        list_ms, list_q = _measure(client, "/", repeat)
        _, search_q = _measure(client, "/?q=Task+1+of+Conversation+99", 1)
        beside_trivial(
            figure=f"conversation list ({conversations:,} conversations): median render",
            value=list_ms,
            target="< 150 ms",
        )
        report.add(
            group="dashboard",
            figure=f"conversation list ({conversations:,}): queries",
            value=list_q,
            baseline_name="trivial logged-in view",
            baseline=base_q,
            unit="queries",
            higher_is_better=False,
        )
        search_ms, _ = _measure(client, "/?q=Task+1+of+Conversation+99", repeat)
        beside_trivial(
            figure=f"conversation search by task title ({search_q} queries)",
            value=search_ms,
        )
