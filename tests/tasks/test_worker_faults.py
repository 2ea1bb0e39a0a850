"""A real worker process meets real faults: a full blob disk, a full SQLite file,
a write lock held past the busy timeout, PostgreSQL sessions terminated.

After each: the worker is still alive and says why it waited, no outside
effect went out twice under one key without a person, no task is left
"running" without a live lease, no blob is left behind, and the doctor is
clean.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from django.db import connection

from artifacts.models import Artifact
from artifacts.store import FolderStore
from tasks.doctor import doctor_run
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tasks.resume import envelope_read
from tests.conftest import REPO
from tests.support.executing import check_invariants, invocations
from tests.support.faults import pg_terminate_others
from tests.support.workers import tools_env, worker_argv

WAIT = 120  # seconds any phase may take on a loaded machine before the test fails


class Worker:
    def __init__(self, proc: subprocess.Popen, out: Path, err: Path):
        self.proc, self.out, self.err = proc, out, err

    def stderr(self) -> str:
        return self.err.read_text() if self.err.exists() else ""

    def stdout(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT)


@pytest.fixture
def worker(subprocess_env, tmp_path):
    started: list[Worker] = []
    log = tmp_path / "tool-calls.jsonl"

    def start(name: str = "worker:faulty", **env_extra: str) -> Worker:
        env = tools_env(
            subprocess_env,
            log,
            PIPPA_FAULT_BASE_SECONDS="0.2",
            PIPPA_FAULT_MAX_SECONDS="1",
            **env_extra,
        )
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        proc = subprocess.Popen(
            worker_argv(worker_id=name, until_idle=False, quiet=False),
            cwd=REPO,
            env=env,
            stdout=out.open("w"),
            stderr=err.open("w"),
        )
        w = Worker(proc, out, err)
        started.append(w)
        return w

    start.log = log
    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def wait_for(condition, what: str, worker: Worker) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert worker.proc.poll() is None, (
            f"the worker died while waiting for {what}: {worker.stderr()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.1)


def assert_settled(worker: Worker, blob_root: Path) -> None:
    """The common ending: clean exit, no running task without a lease, nothing left."""
    code = worker.stop()
    err = worker.stderr()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not Task.objects.filter(status="running").exists()
    assert not Task.objects.exclude(lease_owner="").exists()
    # Every blob is an artifact's, or the saved output of a step that waits
    # for a person (its decision card offers it: "Use the saved output").
    named = set(Artifact.objects.values_list("sha256", flat=True)) | {
        (envelope_read(step.pk).payload or {}).get("sha")
        for step in Step.objects.filter(status="needs_review")
    }
    assert set(FolderStore(blob_root).shas()) <= named
    report = doctor_run(grace_seconds=0, store=FolderStore(blob_root))
    assert report.clean, [f.as_dict() for f in report.findings if f.remaining]
    check_invariants()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_on_a_full_blob_disk_waits_for_room_and_never_resends_an_effect(
    make_conversation, worker, tmpfs, settings, subprocess_env
):
    fs = tmpfs("blobfs", 4 * 1024 * 1024)
    settings.BLOB_DIR = fs.root / "blobs"
    conversation = make_conversation()
    effect = task_create(
        conversation=conversation,
        title="notify",
        steps=[
            {"title": "notify", "tool": "test.effect", "args": {"fill": str(fs.filler)}}
        ],
    )
    later = task_create(
        conversation=conversation,
        title="fetches",
        steps=[{"title": f"fetch {i}", "tool": "test.fetch"} for i in range(3)],
    )
    # Every output a blob file on that tmpfs.
    w = worker(PIPPA_BLOB_DIR=str(settings.BLOB_DIR))

    wait_for(lambda: "disk full" in w.stderr(), "the disk-full line", w)
    wait_for(
        lambda: Task.objects.get(pk=effect.pk).status == "needs_review",
        "the effect's review",
        w,
    )
    # The worker waits for room instead of burning the next task's attempts:
    # it has checked the store again and found it still full.
    wait_for(lambda: "still waiting: disk full" in w.stderr(), "a second check", w)
    assert not Step.objects.filter(task=later, attempts__gt=0).exists()
    assert Task.objects.get(pk=later.pk).status == "queued"

    fs.free()
    wait_for(lambda: Task.objects.get(pk=later.pk).status == "done", "the fetches", w)

    assert "the store takes writes again" in w.stderr()
    notify = Step.objects.get(task=effect)
    assert notify.error == (
        "needs you: the tool ran; its output could not be saved: disk full"
    )
    assert invocations(worker.log, "test.effect") == {notify.pk: 1}
    assert f"task {effect.pk} step 1: needs_review" in w.stdout()
    assert_settled(w, settings.BLOB_DIR)


@pytest.fixture
def sqlite_on_tmpfs(tmpfs, transactional_db):
    """Move this test's SQLite database onto a 16 MiB tmpfs (SQLite only)."""
    if connection.vendor != "sqlite":
        pytest.skip("a full SQLite file is an SQLite fault")
    fs = tmpfs("dbfs", 16 * 1024 * 1024)
    original = connection.settings_dict["NAME"]
    copy = fs.root / "pippa.sqlite3"
    connection.close()
    # A compact copy: the session's test file keeps the free pages of
    # everything earlier tests wrote and flushed.
    source = sqlite3.connect(original)
    source.execute("VACUUM INTO ?", [str(copy)])
    source.close()
    target = sqlite3.connect(copy)
    target.execute("PRAGMA journal_mode=WAL")
    target.close()
    connection.settings_dict["NAME"] = str(copy)
    yield fs, copy
    connection.close()
    connection.settings_dict["NAME"] = original


@pytest.mark.slow
def test_a_worker_whose_sqlite_file_fills_up_backs_off_and_finishes_by_class(
    sqlite_on_tmpfs, make_conversation, worker, settings, tmp_path
):
    fs, db_path = sqlite_on_tmpfs
    conversation = make_conversation()
    fetch = task_create(
        conversation=conversation,
        title="fetch",
        steps=[
            {"title": "fetch", "tool": "test.fetch", "args": {"fill": str(fs.filler)}},
            {"title": "snapshot", "tool": "test.snapshot"},
        ],
    )
    effect = task_create(
        conversation=conversation,
        title="notify",
        steps=[{"title": "notify", "tool": "test.effect"}],
    )
    # Keep the WAL and its index alive and empty: the next write must grow it.
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    w = worker(PIPPA_SQLITE_PATH=str(db_path))

    # It waits, checking again, rather than dying with a traceback.
    wait_for(lambda: "still waiting: disk full" in w.stderr(), "a second check", w)
    fs.free()
    wait_for(
        lambda: set(Task.objects.values_list("status", flat=True)) <= {"done"},
        "both tasks to finish",
        w,
    )

    first = Step.objects.get(task=fetch, position=1)
    calls = invocations(worker.log)
    assert calls[first.pk] == 2  # class 2: fetched again once the disk had room
    assert calls[Step.objects.get(task=effect).pk] == 1
    assert "Traceback" not in w.stderr()
    assert_settled(w, settings.BLOB_DIR)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_locked_out_past_its_busy_timeout_backs_off_and_carries_on(
    make_conversation, worker, settings
):
    if connection.vendor != "sqlite":
        pytest.skip("the busy timeout is SQLite's")
    task = task_create(
        conversation=make_conversation(),
        title="fetch",
        steps=[{"title": "fetch", "tool": "test.fetch", "args": {"sleep": 1.5}}],
    )
    w = worker(PIPPA_SQLITE_TIMEOUT="0.2")
    wait_for(
        lambda: Step.objects.filter(task=task, status="running").exists(),
        "the call to start",
        w,
    )
    # While the tool runs, another process takes the write lock and keeps it.
    blocker = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        wait_for(lambda: "the database is locked" in w.stderr(), "the locked line", w)
        # It waits the lock out: backs off, checks again, backs off again.
        wait_for(lambda: w.stderr().count("backing off") >= 2, "a second back-off", w)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    wait_for(lambda: Task.objects.get(pk=task.pk).status == "done", "the task", w)
    assert_settled(w, settings.BLOB_DIR)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_postgresql_sessions_are_cut_reconnects_and_finishes(
    make_conversation, worker, settings
):
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    conversation = make_conversation()
    plan = [
        {"title": "fetch", "tool": "test.fetch", "args": {"sleep": 0.05}},
        {"title": "file", "tool": "test.file", "args": {"sleep": 0.05}},
        {"title": "snapshot", "tool": "test.snapshot", "args": {"sleep": 0.05}},
        {"title": "render", "tool": "test.render", "args": {"source": 1}},
    ]
    plain = [
        task_create(conversation=conversation, title=f"plain {i}", steps=plan)
        for i in range(6)
    ]
    effects = [
        task_create(
            conversation=conversation,
            title=f"notify {i}",
            steps=[{"title": "notify", "tool": "test.effect", "args": {"sleep": 0.05}}],
        )
        for i in range(3)
    ]
    w = worker(PIPPA_LEASE_SECONDS="5")
    terminated = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        time.sleep(0.25)
        terminated += pg_terminate_others(connection)
    assert terminated > 0
    wait_for(
        lambda: not Task.objects.filter(status__in=["queued", "running"]).exists(),
        "every task to settle",
        w,
    )

    err = w.stderr()
    assert "the database connection was lost" in err
    assert w.proc.poll() is None
    for task in plain:
        assert Task.objects.get(pk=task.pk).status == "done"
    calls = invocations(worker.log, "test.effect")
    for task in effects:
        notify = Step.objects.get(task=task)
        assert calls[notify.pk] == 1  # never sent twice without a person
        assert notify.status in ("done", "needs_review")
        if notify.status == "needs_review":
            assert notify.error.startswith("needs you:")
    assert_settled(w, settings.BLOB_DIR)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_doctor_repairing_beside_live_workers_on_short_leases_takes_no_decision(
    make_conversation, worker, settings
):
    conversation = make_conversation()
    plan = [
        {"title": "fetch", "tool": "test.fetch", "args": {"sleep": 0.02}},
        {"title": "file", "tool": "test.file", "args": {"sleep": 0.02}},
        {"title": "snapshot", "tool": "test.snapshot", "args": {"sleep": 0.02}},
        {"title": "render", "tool": "test.render", "args": {"source": 1}},
        {"title": "notify", "tool": "test.effect", "args": {"sleep": 0.02}},
    ]
    tasks = [
        task_create(conversation=conversation, title=f"live {i}", steps=plan)
        for i in range(8)
    ]
    workers = [worker(f"worker:{n}", PIPPA_LEASE_SECONDS="3") for n in "ab"]
    reports = []
    deadline = time.monotonic() + WAIT
    while Task.objects.filter(status__in=["queued", "running"]).exists():
        assert time.monotonic() < deadline, "the workers did not finish"
        reports.append(
            doctor_run(repair=True, verify=False, store=FolderStore(settings.BLOB_DIR))
        )
    reports.append(doctor_run(repair=True, store=FolderStore(settings.BLOB_DIR)))

    assert len(reports) > 1
    for report in reports:
        for f in report.findings:
            assert f.repaired <= f.found, f.as_dict()
    assert reports[-1].clean
    # The doctor never set a step aside: every decision was a worker's.
    assert not Event.objects.filter(kind="step_needs_review", data__actor="doctor")
    calls = invocations(worker.log)
    for task in tasks:
        for s in Step.objects.filter(task=task):
            if s.tool == "test.effect":
                assert calls[s.pk] == 1
                assert s.status in ("done", "needs_review")
            else:
                assert s.status == "done", (s, s.error)
    for w in workers:
        assert_settled(w, settings.BLOB_DIR)
