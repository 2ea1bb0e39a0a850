"""The worker command: two processes racing, SIGTERM, --until-idle."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict

import pytest
from django.core.management import call_command

from tasks.actions import task_resume
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.executing import check_invariants
from tests.support.workers import tools_env, worker_argv

PLAN = [
    {"title": "fetch", "tool": "test.fetch", "args": {"sleep": 0.01}},
    {"title": "snapshot", "tool": "test.snapshot", "args": {"sleep": 0.01}},
    {"title": "file", "tool": "test.file", "args": {"sleep": 0.01}},
    {"title": "render", "tool": "test.render", "args": {"source": 1}},
]


@pytest.fixture
def spawn(subprocess_env, tmp_path):
    log = tmp_path / "tool-calls.jsonl"

    def start(name: str, *extra: str, lease_seconds: int = 60, crashpoint: str = ""):
        env = tools_env(
            subprocess_env,
            log,
            crashpoint=crashpoint,
            PIPPA_LEASE_SECONDS=str(lease_seconds),
        )
        return subprocess.Popen(
            [*worker_argv(worker_id=name, until_idle=False, quiet=False), *extra],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    start.log = log
    return start


def call_intervals(log):
    """{step id: [(start, end, pid)]} from the side channel."""
    opened, spans = {}, defaultdict(list)
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        key = (entry["step"], entry["pid"])
        if entry["phase"] == "start":
            opened[key] = entry["t"]
        else:
            spans[entry["step"]].append((opened.pop(key), entry["t"], entry["pid"]))
    return spans


def _paused_tasks(make_conversation, n: int) -> list[Task]:
    """``n`` tasks of PLAN in one conversation, paused until a test resumes them."""
    conversation = make_conversation()
    return [
        task_create(
            conversation=conversation, title=f"race {i}", steps=PLAN, queue=False
        )
        for i in range(n)
    ]


def _wait_until(ready, what: str, seconds: float = 120, poll: float = 0.1) -> None:
    """Poll ``ready()`` until it holds; fail saying ``what`` did not happen."""
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(poll)


def _all_done(tasks: list[Task]):
    ids = [t.pk for t in tasks]
    return lambda: not Task.objects.filter(pk__in=ids).exclude(status="done").exists()


def _a_step_running(task: Task):
    return lambda: Step.objects.filter(task=task, status="running").exists()


def _stop(proc) -> str:
    """SIGTERM a worker, wait for a clean exit, return its stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_never_run_one_step_twice_and_never_hit_a_lock_error(
    make_conversation, spawn
):
    tasks = _paused_tasks(make_conversation, 24)
    procs = [spawn(f"worker:{name}", "--poll", "0.05") for name in "ab"]
    # Both workers are up and polling before any work appears.
    for proc in procs:
        assert "stepping runnable tasks" in proc.stdout.readline()
    for task in tasks:
        task_resume(task=task, actor="test")
    _wait_until(_all_done(tasks), "the workers did not finish")
    errors = [_stop(proc) for proc in procs]
    assert not any("database is locked" in err for err in errors), errors
    assert not any("Traceback" in err for err in errors), errors
    for task in tasks:
        task.refresh_from_db()
        assert (task.status, task.steps_done) == ("done", 4)
    # Each step was called exactly once, so no call overlapped another.
    spans = call_intervals(spawn.log)
    for step in Step.objects.filter(task__in=tasks):
        if step.tool == "test.render":
            continue
        assert len(spans[step.pk]) == 1, step
    # And the log agrees: one tool_call_started per step, no takeovers needed.
    starts = Event.objects.filter(task__in=tasks, kind="tool_call_started")
    assert starts.count() == 4 * len(tasks)
    assert not Event.objects.filter(kind="lease_taken_over").exists()
    workers = {e.data["worker"] for e in starts}
    assert workers == {"worker:a", "worker:b"}
    check_invariants([t.pk for t in tasks])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_when_one_racing_worker_is_killed_the_other_takes_over_after_expiry(
    make_conversation, spawn
):
    tasks = _paused_tasks(make_conversation, 6)
    doomed = spawn(
        "worker:doomed", "--poll", "0.05", lease_seconds=2, crashpoint="after_tool:3"
    )
    survivor = spawn("worker:survivor", "--poll", "0.05", lease_seconds=2)
    for proc in (doomed, survivor):
        assert "stepping runnable tasks" in proc.stdout.readline()
    for task in tasks:
        task_resume(task=task, actor="test")
    doomed.communicate(timeout=120)
    assert doomed.returncode == -signal.SIGKILL
    _wait_until(_all_done(tasks), "the survivor did not finish")
    err = _stop(survivor)
    assert "database is locked" not in err
    takeover = Event.objects.get(task__in=tasks, kind="lease_taken_over")
    assert takeover.data["previous_owner"] == "worker:doomed"
    assert takeover.data["worker"] == "worker:survivor"
    check_invariants([t.pk for t in tasks])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigterm_lets_the_current_step_finish_and_releases_the_lease(
    make_conversation, spawn
):
    task = task_create(
        conversation=make_conversation(),
        title="slow",
        steps=[
            {"title": f"slow {i}", "tool": "test.fetch", "args": {"sleep": 0.6}}
            for i in range(6)
        ],
    )
    proc = spawn("worker:term", "--poll", "0.1")
    _wait_until(_a_step_running(task), "the worker never started a step", 60, poll=0.05)
    _stop(proc)
    task.refresh_from_db()
    assert task.lease_owner == ""
    assert task.status == "queued"
    statuses = list(
        Step.objects.filter(task=task)
        .order_by("position")
        .values_list("status", flat=True)
    )
    # The step in flight finished; nothing is left running or half-done.
    assert "running" not in statuses
    assert statuses.count("done") >= 1
    assert statuses.count("pending") >= 1
    released = Event.objects.filter(task=task, kind="lease_released").last()
    assert released.data["previous_owner"] == "worker:term"
    check_invariants([task.pk])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_long_call_keeps_its_lease_alive_and_no_one_takes_it_over(
    make_conversation, spawn
):
    task = task_create(
        conversation=make_conversation(),
        title="long",
        steps=[{"title": "long", "tool": "test.fetch", "args": {"sleep": 6}}],
    )
    first = spawn("worker:long", "--until-idle", lease_seconds=3)
    _wait_until(_a_step_running(task), "the worker never started a step", 60, poll=0.05)
    time.sleep(3.5)  # longer than the lease: only renewal keeps it
    second = spawn("worker:eager", "--until-idle", lease_seconds=3)
    for proc in (first, second):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert Event.objects.filter(task=task, kind="lease_renewed").exists()
    assert not Event.objects.filter(task=task, kind="lease_taken_over").exists()
    assert Event.objects.filter(task=task, kind="tool_call_started").count() == 1
    task.refresh_from_db()
    assert task.status == "done"


@pytest.mark.django_db
def test_until_idle_exits_when_nothing_is_runnable(make_conversation, capsys):
    task = task_create(
        conversation=make_conversation(),
        title="quick",
        steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
    )
    call_command("pippa_worker", "--until-idle", "--worker-id", "worker:inline")
    task.refresh_from_db()
    assert task.status == "done"
    out = capsys.readouterr().out
    assert f"task {task.pk} step 1: done" in out
    assert "stopped after 1 step(s)" in out
