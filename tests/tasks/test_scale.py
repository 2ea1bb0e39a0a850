"""Several hosts for real, on one machine: PostgreSQL, a SeaweedFS bucket and
three workers that share nothing else (each its own empty data folder), 300
tasks of 10 steps, workers killed at random and started again.

What must hold at the end: every task done (nothing lost); every done step's
output intact in the bucket; no step with outside effects called twice
without a person deciding so (a person here takes the decisions a set-aside
step waits for, as Dad would: use the saved output, or skip a call that went
out, or send one that never did); the doctor clean.

``PIPPA_SCALE_TASKS`` and ``PIPPA_SCALE_KILLS`` change the size (300, 24).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from artifacts.store import FolderStore
from tasks.actions import step_resolve, step_resolve_options
from tasks.doctor import doctor_run
from tasks.models import Conversation, Event, Step, Task
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.executing import check_invariants
from tests.support.workers import tools_env, worker_argv

TASKS = int(os.environ.get("PIPPA_SCALE_TASKS", "300"))
KILLS = int(os.environ.get("PIPPA_SCALE_KILLS", "24"))
HOSTS = 3
DEADLINE_SECONDS = 900

# Ten steps: pure steps of every class and two with outside effects (which
# take a little while, so that kills land inside them too).
PLAN = [
    {"title": "fetch", "tool": "test.fetch", "args": {"size": 512}},
    {"title": "search", "tool": "test.snapshot", "args": {}},
    {"title": "file", "tool": "test.file", "args": {}},
    {"title": "e-mail", "tool": "test.effect", "args": {"sleep": 0.03}},
    {"title": "chart", "tool": "test.render", "args": {"source": 1}},
    {"title": "fetch again", "tool": "test.fetch", "args": {"size": 2048}},
    {"title": "quote", "tool": "test.snapshot", "args": {}},
    {"title": "post", "tool": "test.effect", "args": {"sleep": 0.03}},
    {"title": "report file", "tool": "test.file", "args": {"size": 1024}},
    {"title": "summary", "tool": "test.render", "args": {"source": 6}},
]


def calls(log: Path) -> Counter:
    """Real calls (start lines) per step; a line a kill cut short is one too."""
    counted: Counter = Counter()
    if not log.exists():
        return counted
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("phase") == "start":
            counted[entry["step"]] += 1
    return counted


class Hosts:
    """Worker processes, one per host folder; a killed one is started again."""

    def __init__(self, env: dict, root: Path, log: Path):
        self.env, self.root, self.log = env, root, log
        self.procs: dict[int, subprocess.Popen] = {}
        self.lives = Counter()

    def start(self, host: int) -> None:
        self.lives[host] += 1
        folder = self.root / f"host{host}"
        folder.mkdir(exist_ok=True)
        env = tools_env(
            self.env,
            self.log,
            PIPPA_DATA_DIR=str(folder),
            PIPPA_BLOB_DIR=str(folder / "blobs"),  # unused: the bucket holds blobs
            PIPPA_FILES_DIR=str(folder / "files"),
            PIPPA_LEASE_SECONDS="2",
            PIPPA_RETRY_BASE_SECONDS="0",
        )
        self.procs[host] = subprocess.Popen(
            worker_argv(
                worker_id=f"host{host}-life{self.lives[host]}",
                until_idle=False,
                poll=0.1,
            ),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(folder / "worker.log").open("ab"),
        )

    def kill_one(self) -> None:
        host = random.randrange(HOSTS)
        self.procs[host].send_signal(signal.SIGKILL)
        self.procs[host].wait(timeout=30)
        self.start(host)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def decide_as_a_person(log: Path, reruns: Counter) -> int:
    """Take the decisions the set-aside steps wait for; return how many."""
    decided = 0
    sent = calls(log)
    for step in Step.objects.filter(status=Step.Status.NEEDS_REVIEW):
        options = step_resolve_options(step)
        if "adopt" in options:
            action = "adopt"  # its output was saved: use it
        elif sent[step.pk]:
            action = "skip"  # the call went out: never send it again
        else:
            action = "rerun"  # it never went out: send it now
            reruns[step.pk] += 1
        step_resolve(step=step, action=action, actor="dad")
        decided += 1
    return decided


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_SECONDS + 300)
@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="several hosts share PostgreSQL; SQLite is one machine's file "
    "(run with DATABASE_URL=postgres://...)",
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("any_store", ["s3"], indirect=True)
def test_three_hosts_sharing_only_the_database_and_a_bucket_lose_nothing_under_kills(
    any_store, make_user, subprocess_env, tmp_path, settings
):
    assert connection.vendor == "postgresql"
    owner = make_user(username="dad")
    conversation = Conversation.objects.create(owner=owner, title="at scale")
    task_ids = [
        task_create(conversation=conversation, title=f"task {n}", steps=PLAN).pk
        for n in range(TASKS)
    ]
    log = tmp_path / "tool-calls.jsonl"
    hosts = Hosts(subprocess_env, tmp_path, log)
    random.seed(51)
    reruns: Counter = Counter()
    kills = decisions = 0
    started = time.monotonic()
    try:
        for host in range(HOSTS):
            hosts.start(host)
        while time.monotonic() - started < DEADLINE_SECONDS:
            time.sleep(random.uniform(0.5, 2.5))
            decisions += decide_as_a_person(log, reruns)
            if not Task.objects.exclude(status=Task.Status.DONE).exists():
                break
            if kills < KILLS:
                hosts.kill_one()
                kills += 1
    finally:
        hosts.stop()
    seconds = time.monotonic() - started

    left = dict(
        Task.objects.exclude(status=Task.Status.DONE).values_list("pk", "status")
    )
    assert left == {}, f"{len(left)} tasks not done after {seconds:.0f} s: {left}"
    assert kills == KILLS
    # Nothing lost: every step done (or skipped by a person), every output
    # intact in the bucket, and no host's folder holds a blob.
    assert (
        Step.objects.filter(task_id__in=task_ids)
        .exclude(status__in=[Step.Status.DONE, Step.Status.SKIPPED])
        .count()
        == 0
    )
    check_invariants(task_ids)
    for host in range(HOSTS):
        assert not list(FolderStore(tmp_path / f"host{host}" / "blobs").shas())
    # No outside effect sent twice without a person.
    sent = calls(log)
    effects = Step.objects.filter(task_id__in=task_ids, side_effects=True)
    for step_id in effects.values_list("pk", flat=True):
        assert sent[step_id] <= 1 + reruns[step_id], (step_id, sent[step_id])
    # The kills really interrupted work: takeovers happened and were settled.
    assert Event.objects.filter(kind="lease_taken_over").count() > 0
    # The doctor: what killed workers left (blobs put but never named) is
    # swept, and then nothing remains.
    repaired = doctor_run(repair=True, grace_seconds=0)
    assert repaired.clean, [f.as_dict() for f in repaired.findings if f.remaining]
    assert doctor_run(grace_seconds=0).clean
    print(
        f"\n{TASKS} tasks x {len(PLAN)} steps on {HOSTS} hosts: {seconds:.0f} s, "
        f"{kills} kills, {decisions} decisions by a person, "
        f"{sum(reruns.values())} reruns"
    )
