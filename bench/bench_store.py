"""Blob store throughput and event append rate, each against a raw baseline.

Blob store: ``FolderStore.put_bytes`` (hash while writing, a file with no name linked
under its sha, fsync it and its folder) against a plain ``open/write/fsync/rename`` of the same
bytes. Event log: ``event_append`` (one transaction: seq UPDATE … RETURNING + INSERT)
against raw ``sqlite3`` doing the same two statements per transaction.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from artifacts.store import FolderStore
from bench.harness import Report


def _plain_write(folder: Path, name: str, data: bytes) -> None:
    tmp = folder / f".{name}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / name)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bench_blobs(report: Report) -> None:
    sizes = [
        ("1 KiB", 1024, 400),
        ("1 MiB", 1024 * 1024, 40),
        ("64 MiB", 64 * 1024 * 1024, 3),
    ]
    if report.quick:
        sizes = [
            ("1 KiB", 1024, 50),
            ("1 MiB", 1024 * 1024, 5),
            ("64 MiB", 64 * 1024 * 1024, 1),
        ]
    root = Path(tempfile.mkdtemp(prefix="blobs-", dir=settings.DATA_DIR))
    store = FolderStore(root / "store")
    plain = root / "plain"
    plain.mkdir()
    for label, size, count in sizes:
        # Distinct payloads (no dedup shortcut): a random block with a counter.
        block = os.urandom(size)
        payloads = [i.to_bytes(8, "big") + block[8:] for i in range(count)]
        # Interleave the two sides so load swings hit both alike.
        t_store = t_plain = 0.0
        for i, data in enumerate(payloads):
            start = time.perf_counter()
            store.put_bytes(data)
            t_store += time.perf_counter() - start
            start = time.perf_counter()
            _plain_write(plain, f"p{i}", data)
            t_plain += time.perf_counter() - start
        mb = size * count / (1024 * 1024)
        report.add(
            group="blob store",
            figure=f"put {label}",
            value=mb / t_store,
            baseline_name="open/write/fsync/rename",
            baseline=mb / t_plain,
            unit="MB/s",
            target=">= 0.5 (it also hashes every byte)",
        )


def _bench_events(report: Report) -> None:
    from django.contrib.auth import get_user_model

    from tasks.models import Conversation, Task
    from tasks.services import event_append

    n = 300 if report.quick else 2000
    user = get_user_model().objects.create_user("bench-events")
    task = Task.objects.create(
        conversation=Conversation.objects.create(owner=user, title="bench"),
        title="bench",
    )
    data = {"sha256": "ab" * 32, "size": 1024}

    start = time.perf_counter()
    for _ in range(n):
        event_append(task_id=task.pk, kind="payload_persisted", data=data)
    ours = n / (time.perf_counter() - start)

    # Raw sqlite3: the same schema (a copy of the two tables and the event
    # indexes), the same pragmas (the sync level ours runs at: FULL unless
    # PIPPA_SQLITE_SYNCHRONOUS says otherwise), one BEGIN IMMEDIATE
    # transaction per append doing the same two statements.
    level = "FULL"  # PostgreSQL's worker connections: synchronous_commit on
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous")
            level = {1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
                cursor.fetchone()[0], "FULL"
            )
    path = Path(tempfile.mkdtemp(prefix="raw-", dir=settings.DATA_DIR)) / "raw.sqlite3"
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(
        f"""
        PRAGMA journal_mode=WAL; PRAGMA synchronous={level}; PRAGMA foreign_keys=ON;
        CREATE TABLE task (id INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE event (id INTEGER PRIMARY KEY AUTOINCREMENT,
            task_id INTEGER NOT NULL REFERENCES task(id) ON DELETE CASCADE,
            step_id INTEGER NULL, seq INTEGER NOT NULL, kind VARCHAR(40) NOT NULL,
            data TEXT NOT NULL, created_at DATETIME NOT NULL, UNIQUE (task_id, seq));
        CREATE INDEX event_kind ON event (task_id, kind, seq);
        CREATE INDEX event_step ON event (step_id, seq);
        CREATE INDEX event_calls ON event (step_id, seq)
            WHERE kind = 'tool_call_started';
        CREATE INDEX event_payloads ON event (step_id, seq)
            WHERE kind = 'payload_persisted';
        INSERT INTO task (id) VALUES (1);
        """
    )
    import json
    from datetime import UTC, datetime

    payload = json.dumps(data)
    start = time.perf_counter()
    for _ in range(n):
        raw.execute("BEGIN IMMEDIATE")
        (seq,) = raw.execute(
            "UPDATE task SET last_seq = last_seq + 1 WHERE id = 1 RETURNING last_seq"
        ).fetchone()
        raw.execute(
            "INSERT INTO event (task_id, step_id, seq, kind, data, created_at) "
            "VALUES (1, NULL, ?, 'payload_persisted', ?, ?)",
            (seq, payload, datetime.now(UTC).isoformat()),
        )
        raw.execute("COMMIT")
    baseline = n / (time.perf_counter() - start)
    raw.close()
    report.add(
        group="event log",
        figure=f"event_append ({connection.vendor}), {n} appends",
        value=ours,
        baseline_name="raw sqlite3, same statements",
        baseline=baseline,
        unit="appends/s",
        target="the ORM's overhead, measured",
    )


def run(report: Report) -> None:
    _bench_blobs(report)
    _bench_events(report)
