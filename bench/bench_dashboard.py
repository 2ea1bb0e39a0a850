"""Dashboard pages at scale, in one process: does a page cost the same at step
10 as at step 10,000?

Figures: the task page of a task with 10,000 steps and 100,000 events, its
htmx timeline poll, and the conversation list with 1,000 conversations:
median render time through the whole middleware stack (session, auth, CSRF,
CSP, htmx) against a target, and the number of queries against the same page
of a small task. What a user meets under load (the same pages over the real
server, beside 20 polling viewers) is ``bench_load``'s.

The timeline is paginated (``STEPS_PER_PAGE`` steps a page, opening at the
current step). The "whole timeline on one page" row shows why: rendering every
row scales with the plan's length, while a page costs the same at step 10 or
10,000.
"""

from __future__ import annotations

import html
import re
import time
from datetime import timedelta
from functools import partial

from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from bench.harness import Report, median_ms
from dashboard.selectors import timeline
from tasks.models import Conversation, Event, Step, Task, TaskArtifact

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
    with override_settings(ALLOWED_HOSTS=["testserver"], DEBUG=False):
        User = get_user_model()
        dad = User.objects.create_user(username=f"bench-dad-{time.time_ns()}")
        home = Conversation.objects.create(owner=dad, title="Bench home")
        big = _task_with(home, steps=steps, events=events, outputs=100)
        small = _task_with(home, steps=10, events=10, outputs=5)
        lister = User.objects.create_user(username=f"bench-list-{time.time_ns()}")
        _conversations(lister, conversations)

        client = Client()
        client.force_login(dad)
        # A time in ms against its target (lower is better).
        within = partial(
            report.add,
            group="dashboard",
            baseline_name="target",
            unit="ms",
            higher_is_better=False,
            target="<= 1.0 x baseline",
        )

        ms, q = _measure(client, big.get_absolute_url(), repeat)
        _, small_q = _measure(client, small.get_absolute_url(), 1)
        label = f"{steps:,} steps, {events:,} events"
        within(figure=f"task page ({label}): median render", value=ms, baseline=300)
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
        poll_ms, poll_q = _measure(
            client,
            big.get_absolute_url(),
            repeat,
            **{"HX-Request": "true", "HX-Target": "timeline"},
        )
        within(
            figure=f"timeline htmx poll ({poll_q} queries)", value=poll_ms, baseline=200
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
        within(
            figure=f"idle poll of a live task, nothing changed "
            f"({idle.status_code}, {len(idle.content):,} B, {idle_q} queries)",
            value=idle_ms,
            baseline=10,
        )
        older = big.get_absolute_url() + f"?before={events // 2}&kind=lease_renewed"
        deep_ms, _ = _measure(client, older, repeat)
        within(
            figure="task page, events filtered by kind, mid-log page",
            value=deep_ms,
            baseline=300,
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
        within(
            figure=f"conversation list ({conversations:,} conversations, "
            f"{list_q} queries): median render",
            value=list_ms,
            baseline=150,
        )
        search_ms, _ = _measure(client, "/?q=Task+1+of+Conversation+99", repeat)
        within(
            figure=f"conversation search by task title ({search_q} queries)",
            value=search_ms,
            baseline=150,
        )
