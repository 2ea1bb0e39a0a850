"""Sequential durable steps per second: the executor against raw sqlite3, same run.

Both sides do, per step, the same logical writes with the same durability and
in the same two commits the design requires:

1. ``BEGIN IMMEDIATE``: renew the lease (conditional UPDATE), pick the first
   unfinished step, mark it running and count the attempt, reserve a seq and
   insert ``tool_call_started``; COMMIT (before the call), at
   ``synchronous=NORMAL`` (the tool has no outside effects: losing this
   commit re-runs a call whose result nobody saw).
2. The 1 KiB payload as a blob file (linked under its sha, then the file
   and its folder fsynced: the same ``FolderStore`` code on both sides).
3. At ``synchronous=FULL`` (the result is shown after it): insert the
   artifact row (ON CONFLICT on sha), the ownership link, mark the step done
   with its output ref, reserve two seqs and bump progress, insert
   ``payload_persisted`` and ``tool_result_persisted``; COMMIT.

The sides alternate every 20 steps so a swing in fsync latency hits both;
each figure is total steps over total time.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from artifacts.store import FolderStore
from tasks.executor import step
from tasks.models import Conversation, Task
from tasks.plan import task_create
from tasks.tools import ToolResult, tool_register

PAYLOAD_BYTES = 1024
STEPS_PER_TASK = 200


def _bench_tool(ctx, *, n: int = 0) -> ToolResult:
    head = f"bench step {ctx.step_id} {time.time_ns()} ".encode()
    return ToolResult(data=(head * (PAYLOAD_BYTES // len(head) + 1))[:PAYLOAD_BYTES])


def tool_setup() -> None:
    tool_register(
        "bench.payload", _bench_tool, artifact_class=2, media_type="text/plain"
    )


def _make_tasks(conversation: Conversation, steps: int) -> list[int]:
    """Tasks of up to 200 steps each (the plan's limit), set up outside the timing."""
    ids = []
    left = steps
    while left > 0:
        n = min(STEPS_PER_TASK, left)
        task = task_create(
            conversation=conversation,
            title="bench",
            steps=[
                {"title": f"s{i}", "tool": "bench.payload", "args": {}}
                for i in range(n)
            ],
        )
        ids.append(task.pk)
        left -= n
    return ids


class ExecutorSide:
    """Steps through ``tasks.executor.step``, a chunk at a time."""

    def __init__(self, task_ids: list[int]):
        self.task_ids = list(task_ids)

    def run(self, steps: int) -> float:
        """Do ``steps`` steps; return the elapsed seconds."""
        done = 0
        started = time.perf_counter()
        while done < steps:
            outcome = step(task_id=self.task_ids[0], worker_id="bench:executor")
            if outcome is None or outcome.position is None:
                self.task_ids.pop(0)
                continue
            done += 1
            if outcome.task_status != Task.Status.RUNNING:
                self.task_ids.pop(0)
        return time.perf_counter() - started


class RawExecutor:
    """The same writes through the sqlite3 module, with no framework in between."""

    def __init__(
        self, db_path: str, blob_dir: Path, task_ids: list[int], fsync: bool = True
    ):
        self.task_ids = list(task_ids)
        self.current: int | None = None
        self.db = sqlite3.connect(db_path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.store = FolderStore(blob_dir, fsync=fsync)
        self.worker = "bench:raw"

    @staticmethod
    def _now() -> str:
        return timezone.now().strftime("%Y-%m-%d %H:%M:%S.%f")

    def _until(self) -> str:
        return (timezone.now() + timedelta(seconds=60)).strftime("%Y-%m-%d %H:%M:%S.%f")

    def _events(self, task_id, last_seq, entries):
        first = last_seq - len(entries) + 1
        now = self._now()
        self.db.executemany(
            "INSERT INTO tasks_event (task_id, step_id, seq, kind, data, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (task_id, step_id, first + i, kind, json.dumps(data), now)
                for i, (kind, step_id, data) in enumerate(entries)
            ],
        )

    def _seq(self, task_id, n, extra=""):
        return self.db.execute(
            "UPDATE tasks_task SET last_seq = last_seq + ?, lease_expires_at = ?, "
            f"updated_at = ?{extra} WHERE id = ? AND lease_owner = ? "
            "RETURNING last_seq, steps_done, steps_total",
            (n, self._until(), self._now(), task_id, self.worker),
        ).fetchone()

    def take(self, task_id: int) -> None:
        self.db.execute(
            "UPDATE tasks_task SET lease_owner = ?, lease_expires_at = ?, status = 'running' "
            "WHERE id = ?",
            (self.worker, self._until(), task_id),
        )

    def step(self, task_id: int) -> bool:
        db = self.db
        # 1. Lease, pick, start: one commit before the call.
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "UPDATE tasks_task SET lease_expires_at = ?, status = 'running', updated_at = ? "
            "WHERE id = ? AND lease_owner = ? AND status IN ('queued', 'running') "
            "RETURNING steps_total, steps_done",
            (self._until(), self._now(), task_id, self.worker),
        ).fetchone()
        row = db.execute(
            "SELECT id, position, title, status, tool, args, artifact_class, side_effects, "
            "attempts, max_attempts, generation, (SELECT c.owner_id FROM tasks_task t "
            "JOIN tasks_conversation c ON c.id = t.conversation_id WHERE t.id = ?) "
            "FROM tasks_step WHERE task_id = ? "
            "AND status NOT IN ('done', 'skipped') ORDER BY position LIMIT 1",
            (task_id, task_id),
        ).fetchone()
        if row is None:
            db.execute("COMMIT")
            return False
        step_id, attempts, generation = row[0], row[8] + 1, row[10]
        key = f"pippa:{task_id}:{step_id}:{generation}"
        db.execute(
            "UPDATE tasks_step SET status = 'running', attempts = attempts + 1, "
            "started_at = ?, finished_at = NULL WHERE id = ?",
            (self._now(), step_id),
        )
        last = self._seq(task_id, 1)[0]
        self._events(
            task_id,
            last,
            [
                (
                    "tool_call_started",
                    step_id,
                    {
                        "tool": row[4],
                        "class": row[6],
                        "attempt": attempts,
                        "generation": generation,
                        "key": key,
                        "worker": self.worker,
                    },
                )
            ],
        )
        db.execute("COMMIT")
        # The call, then the durable bytes: a blob file first.
        result = _bench_tool(SimpleNamespace(step_id=step_id))
        put = self.store.put_bytes(result.data)
        # 2. Artifact, link, step done, payload_persisted and
        # tool_result_persisted: one commit, on disk before it is shown.
        db.execute("PRAGMA synchronous=FULL")
        db.execute("BEGIN IMMEDIATE")
        now = self._now()
        found = db.execute(
            "INSERT INTO artifacts_artifact (owner_id, sha256, size, media_type, "
            "artifact_class, title, meta, integrity, verified_at, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, 'ok', ?, ?) "
            "ON CONFLICT (owner_id, sha256) DO NOTHING RETURNING id",
            (
                row[11],
                put.sha256,
                put.size,
                "text/plain",
                row[6],
                row[2],
                '{"tool": "x"}',
                now,
                now,
            ),
        ).fetchone()
        artifact_id = found[0]
        db.execute(
            "INSERT INTO tasks_taskartifact (artifact_id, task_id, step_id, role, "
            "created_at) VALUES (?, ?, ?, 'persisted', ?) "
            "ON CONFLICT (task_id, artifact_id, role) DO NOTHING",
            (artifact_id, task_id, step_id, now),
        )
        db.execute(
            "UPDATE tasks_step SET status = 'done', output_id = ?, finished_at = ?, "
            "error = '' WHERE id = ?",
            (artifact_id, now, step_id),
        )
        last, done, total = self._seq(task_id, 2, ", steps_done = steps_done + 1")
        payload = {
            "sha": put.sha256,
            "size": put.size,
            "media_type": "text/plain",
            "title": row[2],
            "meta": {},
            "attempt": attempts,
            "generation": generation,
            "key": key,
        }
        result_data = {
            "artifact_id": artifact_id,
            "sha": put.sha256,
            "size": put.size,
            "class": row[6],
            "attempt": attempts,
        }
        self._events(
            task_id,
            last,
            [
                ("payload_persisted", step_id, payload),
                ("tool_result_persisted", step_id, result_data),
            ],
        )
        db.execute("COMMIT")
        db.execute("PRAGMA synchronous=NORMAL")
        return True

    def run(self, steps: int) -> float:
        """Do ``steps`` steps on this side's tasks; return the elapsed seconds."""
        done = 0
        started = time.perf_counter()
        while done < steps:
            if self.current is None:
                self.current = self.task_ids.pop(0)
                self.take(self.current)
            if self.step(self.current):
                done += 1
            else:
                self.current = None
        return time.perf_counter() - started


def run(report) -> None:
    tool_setup()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    conversation = Conversation.objects.create(owner=user, title="bench")
    # The two sides alternate in chunks of a few steps, so a swing in fsync
    # latency (it moves 10x with the machine's load) hits both alike.
    total = 300 if report.quick else 1200
    chunk = 20
    db_path = settings.DATABASES["default"]["NAME"]
    if connection.vendor != "sqlite":
        print("  executor bench needs SQLite (the raw baseline is sqlite3); skipped")
        return

    def measure(fsync: bool) -> tuple[float, float]:
        settings.PIPPA_FSYNC = fsync
        raw = RawExecutor(
            db_path,
            Path(settings.BLOB_DIR).parent / f"raw-blobs-{fsync}",
            _make_tasks(conversation, total),
            fsync=fsync,
        )
        ex = ExecutorSide(_make_tasks(conversation, total))
        raw_time = ex_time = 0.0
        for _ in range(total // chunk):
            raw_time += raw.run(chunk)
            ex_time += ex.run(chunk)
        raw.db.close()
        return total / ex_time, total / raw_time

    ex, raw = measure(True)
    report.add(
        group="executor",
        figure=f"durable steps/s (1 KiB payload, blob fsync'd, 2 commits; {total} steps)",
        value=ex,
        baseline_name="raw sqlite3, same writes and commits",
        baseline=raw,
        unit="steps/s",
        higher_is_better=True,
        target=">= 0.50 x baseline",
    )
    ex_soft, raw_soft = measure(False)
    report.add(
        group="executor",
        figure="steps/s with fsync off (software cost only)",
        value=ex_soft,
        baseline_name="raw sqlite3, fsync off",
        baseline=raw_soft,
        unit="steps/s",
        higher_is_better=True,
        target="(diagnostic)",
    )
    settings.PIPPA_FSYNC = True
