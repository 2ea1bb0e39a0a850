"""The doctor: find, and on request repair, what older code or a crash left.

``doctor_run(repair=False)`` checks; ``doctor_run(repair=True)`` checks,
repairs in dependency order, then checks again, so every finding carries
``found``, ``repaired`` and ``remaining``. The ``pippa_doctor`` command and
the admin only present the ``DoctorReport``.

Repair order (each step may free rows for the next):

1. Rows whose parent is gone (the foreign-keys-off bug): tasks, council rows,
   steps, events, links, lineage edges. Deleting a parent lets the schema
   cascade to its children; each chunk is its own short transaction.
2. Artifacts nothing alive keeps (after 1, artifacts kept only by orphans
   are among them); their blobs are unlinked after the commit.
3. Blob files no row names and stale temp files, older than the grace period
   so an in-flight write (blob first, row second) is never swept; the
   class-1 folders of tasks that are gone (a delete killed after its commit).
4. Rows whose blob is missing or fails its sha: flagged through
   ``Artifact.integrity``, never deleted; they stay problems for a person.
5. Expired leases (held, and dead: ``Task.objects.lease_stale``, a holder
   with no expiry or past it): released (a running task goes back to
   queued), with a ``lease_released`` event. Only if the lease is still the
   expired one.
6. Blob unlinks a killed delete left written down (``PendingUnlink``):
   finished at once, no grace period.
7. Data files and folders other accounts could read (the data folder, the
   database's files, the blob store, the class-1 files): tightened to 0700
   folders, 0600 database files, 0400 blob and class-1 files
   (``pippa_site.private``, ``tasks.tools.files_loose_paths``).
8. Tool-call envelopes still open on a step no worker will ever pick up (its
   task is done, failed or waiting for a person): the step goes to
   ``needs_review``, with an event saying why.

The doctor never takes a decision a worker would take. An open tool call on
a queued, running or paused task belongs to the next worker's class rules
(``tasks.resume.uncertain_decide``), however long its lease has been dead;
the doctor leaves it alone. "Open" means what resume means by it
(``tasks.resume.CLOSING_KINDS``), so a step an operator chose to run again
is not open.

Every figure comes from one consistent read (a read-only snapshot
transaction that blocks no writer), and ``--repair`` touches only what that
read found, each item re-checked at its write, so it is safe beside live
workers: ``repaired`` never exceeds ``found``. An orphan check's repair and
the count after it visit only the ids where that read found the check's
rows; a row that lost its parent since is the next run's to find.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from artifacts.gc import (
    batched,
    blobs_unlink,
    pending_unlinks_finish,
    unowned_artifacts,
    unowned_artifacts_delete,
)
from artifacts.models import Artifact, ArtifactSource, PendingUnlink
from artifacts.store import BlobStore, StoredBlob, default_store
from pippa_site.private import loose_paths
from tasks.hooks import step_waiting_send
from tasks.lease import lease_release
from tasks.models import LEASE_DEAD, Conversation, Event, Step, Task, TaskArtifact
from tasks.resume import CLOSING_KINDS
from tasks.services import event_append
from tasks.tools import files_loose_paths, task_folders, task_folders_remove

DEFAULT_GRACE_SECONDS = 3600
CHUNK = 20000
SAMPLE = 10
PROGRESS_EVERY = 2000
INTEGRITY_BATCH = 500  # artifacts whose blobs are checked together

ACTOR = "doctor"
ENVELOPE_OPEN_REASON = "tool call left open on a task no worker will pick up ({status})"
# Tasks a worker steps (queued, running) or will step once resumed (paused):
# an open envelope there is the next worker's to resolve by class.
WORKER_STATUSES = (Task.Status.QUEUED, Task.Status.RUNNING, Task.Status.PAUSED)

Progress = Callable[[str], None]


@dataclass
class Finding:
    key: str
    label: str
    found: int = 0
    repaired: int = 0
    remaining: int = 0
    fixable: bool = True
    advice: str = ""
    sample: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "found": self.found,
            "repaired": self.repaired,
            "remaining": self.remaining,
            "fixable": self.fixable,
            "advice": self.advice,
            "sample": self.sample,
        }


@dataclass
class DoctorReport:
    repair: bool
    findings: list[Finding] = field(default_factory=list)
    store: str = ""  # where the blobs are, in words (BlobStore.describe)
    seconds: float = 0.0
    # Tasks the repair logged an event on (a lease released, a call handed
    # to a person): the admin names the staff user on each of them.
    touched_tasks: list[int] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return sum(f.remaining for f in self.findings)

    @property
    def clean(self) -> bool:
        return self.problems == 0

    def finding(self, key: str) -> Finding:
        return next(f for f in self.findings if f.key == key)

    def as_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "repair": self.repair,
            "store": self.store,
            "problems": self.problems,
            "seconds": round(self.seconds, 3),
            "findings": [f.as_dict() for f in self.findings],
        }


# -- rows whose parent is gone ---------------------------------------------------


def _q(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def missing_sql(model, column: str) -> str:
    """SQL: the row ``x``'s ``column`` names no row of ``model``."""
    return f"NOT EXISTS (SELECT 1 FROM {_q(model)} p WHERE p.id = x.{column})"


@dataclass(frozen=True)
class OrphanCheck:
    """Rows of ``model`` (alias ``x``) matching ``condition`` lost a parent."""

    key: str
    label: str
    model: Any
    condition: str
    fixable: bool = True
    advice: str = ""


# Apps above tasks add the checks of their own tables (council: rounds, turns).
_registered: list[Callable[[], list[OrphanCheck]]] = []


def orphan_checks_register(checks: Callable[[], list[OrphanCheck]]) -> None:
    """Add an app's orphan checks (a function, called when the doctor runs)."""
    if checks not in _registered:
        _registered.append(checks)


def _orphan_checks() -> list[OrphanCheck]:
    """Every orphan check, parents first: this app's and artifacts', then each
    registered app's.

    One missing parent per check: an ``OR`` of two ``NOT EXISTS`` keeps
    PostgreSQL from planning anti-joins (0.5 s instead of 0.03 s on 100k events).
    """
    step_gone = f"x.step_id IS NOT NULL AND {missing_sql(Step, 'step_id')}"
    own = [
        OrphanCheck("orphan_tasks", "tasks whose conversation is gone", Task,
                    missing_sql(Conversation, "conversation_id")),
        OrphanCheck("orphan_steps", "steps whose task is gone", Step,
                    missing_sql(Task, "task_id")),
        OrphanCheck("orphan_events", "events whose task is gone", Event,
                    missing_sql(Task, "task_id")),
        OrphanCheck("orphan_step_events", "events whose step is gone", Event, step_gone),
        OrphanCheck("orphan_links", "task links whose task is gone", TaskArtifact,
                    missing_sql(Task, "task_id")),
        OrphanCheck("orphan_step_links", "task links whose step is gone", TaskArtifact,
                    step_gone),
        OrphanCheck("dangling_task_links", "task links whose artifact is gone",
                    TaskArtifact, missing_sql(Artifact, "artifact_id")),
        OrphanCheck("orphan_lineage", "lineage edges whose derived artifact is gone",
                    ArtifactSource, missing_sql(Artifact, "artifact_id")),
        OrphanCheck("dangling_lineage", "lineage edges whose source artifact is gone",
                    ArtifactSource, missing_sql(Artifact, "source_id")),
        OrphanCheck("dangling_outputs", "steps whose output artifact is gone", Step,
                    f"x.output_id IS NOT NULL AND {missing_sql(Artifact, 'output_id')}",
                    False, "a person must retry or branch the step: its output is lost"),
    ]  # fmt: skip
    return own + [check for checks in _registered for check in checks()]


def _count(model, condition: str) -> tuple[int, list[int], tuple[int, int] | None]:
    """(count, the first ids, (lowest id, highest id) or None) of the matching rows."""
    table = _q(model)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(*), MIN(x.id), MAX(x.id) FROM {table} x WHERE {condition}"
        )
        count, low, high = cursor.fetchone()
        ids: list[int] = []
        if count:  # from the first match on, not again from the table's start
            cursor.execute(
                f"SELECT x.id FROM {table} x WHERE x.id >= %s AND {condition} "
                f"ORDER BY x.id LIMIT {SAMPLE}",
                [low],
            )
            ids = [row[0] for row in cursor.fetchall()]
    return count, ids, (low, high) if count else None


def _delete_in_chunks(
    model, condition: str, span: tuple[int, int], label: str, total: int, progress
) -> int:
    """Delete matching rows a range of ids per short transaction; return rows deleted.

    Set-based, no row comes back to Python: each statement deletes the
    matching rows among ``CHUNK`` consecutive ids (a primary-key range scan),
    so a chunk never scans again what the ones before it passed and no
    transaction holds the write lock for more than ``CHUNK`` rows. Only the
    ids ``span`` covers are visited: the check's snapshot found its rows
    there (a deleted conversation's rows lie together), so the rest of a
    large table is never scanned again.
    """
    table = _q(model)
    low, high = span
    deleted = 0
    start = low - 1
    while start < high:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} AS x WHERE x.id > %s AND x.id <= %s "
                f"AND {condition}",
                [start, min(start + CHUNK, high)],
            )
            n = max(cursor.rowcount, 0)
        start += CHUNK
        if n:
            deleted += n
            progress(f"removed {deleted:,}/{total:,} {label}")
    return deleted


# -- blobs -------------------------------------------------------------------------


def _in_flight_payloads() -> set[str]:
    """Shas that an open envelope's ``payload_persisted`` names: a running
    step's, which the next worker may adopt however long its store was down,
    and a step's that waits for a person, whose decision card offers the
    saved output ("Use the saved output")."""
    # From the few running steps to their events (the step index), not a
    # scan of every event joined to its step (0.2 s on 100k events).
    running = Step.objects.filter(
        status__in=[Step.Status.RUNNING, Step.Status.NEEDS_REVIEW]
    ).values("id")
    return {
        sha
        for sha in Event.objects.filter(
            kind=Event.Kind.PAYLOAD_PERSISTED, step_id__in=running
        )
        .order_by()
        .values_list("data__sha", flat=True)
        if isinstance(sha, str)
    }


def _orphan_blobs(store: BlobStore, cutoff: float) -> list[tuple[str, float]]:
    """(sha, modified) of blobs older than ``cutoff`` that no row names, that
    no open envelope may still adopt and that no pending unlink already has:
    the store's listing (a folder's files, a bucket's objects) against the
    database."""
    found = []
    pending: list[StoredBlob] = []
    spoken_for = _in_flight_payloads() | set(
        PendingUnlink.objects.values_list("sha256", flat=True)
    )

    def flush():
        named = spoken_for | set(
            Artifact.objects.filter(sha256__in=[b.sha256 for b in pending]).values_list(
                "sha256", flat=True
            )
        )
        for blob in pending:
            if blob.sha256 not in named and blob.modified < cutoff:
                found.append((blob.sha256, blob.modified))
        pending.clear()

    for blob in store.iter_blobs():
        pending.append(blob)
        if len(pending) >= 500:
            flush()
    if pending:
        flush()
    return found


def _gone_task_folders(cutoff: float) -> list[tuple[int, Any]]:
    """(task id, folder) of the class-1 folders older than ``cutoff`` whose
    task is gone: a delete killed between its commit and removing them. (A
    younger folder may be a task's this read is too early to see.)"""
    folders = {}
    for pk, folder in task_folders().items():
        try:
            if folder.stat().st_mtime < cutoff:
                folders[pk] = folder
        except FileNotFoundError:
            pass
    alive: set[int] = set()
    for chunk in batched(sorted(folders)):
        alive.update(Task.objects.filter(pk__in=chunk).values_list("pk", flat=True))
    return [(pk, folders[pk]) for pk in sorted(set(folders) - alive)]


def _stale_temp_files(store: BlobStore, cutoff: float) -> list[Any]:
    stale = []
    for path in store.iter_temp_files():
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                stale.append(path)
        except FileNotFoundError:
            pass
    return stale


def _integrity_scan(
    store: BlobStore, *, verify: bool, progress: Progress
) -> tuple[dict[int, str], list[int]]:
    """Return ({id: "missing"|"corrupt"} for damaged rows, [ids flagged but intact])."""
    damaged: dict[int, str] = {}
    restored: list[int] = []
    total = Artifact.objects.count()
    rows = (
        Artifact.objects.order_by("pk")
        .values_list("pk", "sha256", "size", "integrity")
        .iterator(chunk_size=INTEGRITY_BATCH)
    )
    flagged = {Artifact.Integrity.MISSING, Artifact.Integrity.CORRUPT}
    checked = 0
    for batch in batched(rows, INTEGRITY_BATCH):
        states = store.states([sha for _, sha, _, _ in batch], verify=verify)
        for pk, sha, size, integrity in batch:
            there = states.get(sha)
            if there is None:
                state = Artifact.Integrity.MISSING
            elif there != (size, True):
                state = Artifact.Integrity.CORRUPT
            else:
                state = Artifact.Integrity.OK
            if state != Artifact.Integrity.OK:
                damaged[pk] = state
            elif integrity in flagged:
                restored.append(pk)
        before, checked = checked, checked + len(batch)
        if checked // PROGRESS_EVERY != before // PROGRESS_EVERY:
            progress(f"checked {checked:,}/{total:,} artifact blobs")
    return damaged, restored


# -- leases and envelopes ------------------------------------------------------------


def _expired_leases() -> list[tuple[int, str]]:
    return list(
        Task.objects.lease_stale().order_by("pk").values_list("pk", "lease_owner")
    )


def _open_envelopes(now) -> list[tuple[int, int, int]]:
    """(event id, task id, step id) of tool calls no worker will ever resolve.

    The step's latest ``tool_call_started`` has no closing event after it
    (resume's ``CLOSING_KINDS``), the step is still ``running``, the call is
    older than a lease, the task's lease is dead (``LEASE_DEAD``), and it is not
    one a worker steps (queued, running, or paused until resumed).
    """
    cutoff = now - timedelta(seconds=settings.PIPPA_LEASE_SECONDS)
    ev = _q(Event)
    task = _q(Task)
    step = _q(Step)
    closing = sorted(str(k) for k in CLOSING_KINDS)
    later = ", ".join(["%s"] * (len(closing) + 1))
    statuses = ", ".join(["%s"] * len(WORKER_STATUSES))
    sql = f"""
        SELECT x.id, x.task_id, x.step_id FROM {ev} x
          JOIN {step} s ON s.id = x.step_id AND s.status = %s
          JOIN {task} t ON t.id = x.task_id
         WHERE x.kind = %s AND x.created_at < %s
           AND NOT EXISTS (SELECT 1 FROM {ev} f
                            WHERE f.step_id = x.step_id AND f.seq > x.seq
                              AND f.kind IN ({later}))
           AND t.status NOT IN ({statuses})
           AND {LEASE_DEAD}
         ORDER BY x.id
    """
    adapt = connection.ops.adapt_datetimefield_value
    params = [
        Step.Status.RUNNING.value,
        Event.Kind.TOOL_CALL_STARTED.value,
        adapt(cutoff),
        *closing,
        Event.Kind.TOOL_CALL_STARTED.value,
        *[str(x) for x in WORKER_STATUSES],
        adapt(now),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()]


def _lease_release(task_id: int, owner: str) -> bool:
    """Release a lease only if it is still the expired one the check found.

    A running task is queued again; the next worker resolves its open step
    by class.
    """
    return lease_release(
        task=Task(pk=task_id),
        actor=ACTOR,
        owner=owner,
        dead_only=True,
        reason="lease expired",
    )


def _envelope_close(event_id: int, task_id: int, step_id: int) -> bool:
    """Hand a call no worker will resolve to a person: the step needs review.

    Re-checked under the task's lock: if the envelope closed, the step moved
    on or the task went back to a worker meanwhile, nothing is written.
    """
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        still_open = {e[0] for e in _open_envelopes(timezone.now())}
        if task is None or event_id not in still_open:
            return False
        data = {
            "actor": ACTOR,
            "reason": ENVELOPE_OPEN_REASON.format(status=task.status),
            "event": event_id,
        }
        if Step.objects.filter(pk=step_id, status=Step.Status.RUNNING).update(
            status=Step.Status.NEEDS_REVIEW, error=data["reason"]
        ):
            step_waiting_send(step_id=step_id, reason=Step.Status.NEEDS_REVIEW)
        Task.objects.filter(pk=task_id).exclude(
            status__in=[Task.Status.DONE, Task.Status.FAILED, Task.Status.CANCELLED]
        ).update(status=Task.Status.NEEDS_REVIEW, updated_at=timezone.now())
        event_append(
            task_id=task_id,
            step_id=step_id,
            kind=Event.Kind.STEP_NEEDS_REVIEW,
            data=data,
        )
    return True


# -- the run ---------------------------------------------------------------------------


@contextmanager
def _one_read() -> Iterator[None]:
    """Run the checks in one read-only snapshot that blocks no writer.

    PostgreSQL: a REPEATABLE READ, READ ONLY transaction. SQLite: a DEFERRED
    transaction, which in WAL mode reads one snapshot without taking the
    write lock (the connection's IMMEDIATE mode would block every worker for
    the length of the scan). Inside a caller's transaction (tests) that
    transaction is the snapshot already.
    """
    if connection.in_atomic_block:
        yield
        return
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        mode = connection.transaction_mode
        connection.transaction_mode = "DEFERRED"
        try:
            with transaction.atomic():
                connection.transaction_mode = mode
                yield
        finally:
            connection.transaction_mode = mode
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
                )
        yield


def _check(
    *,
    store: BlobStore,
    grace_seconds: int,
    verify: bool,
    integrity: bool,
    progress: Progress,
    spans: dict[str, tuple[int, int] | None] | None = None,
) -> dict[str, tuple[int, list, Any]]:
    """Return {key: (count, sample, detail)} for every check.

    ``spans`` (the check after a repair) limits each orphan check to the ids
    where the check before found its rows: what is left of what was found.
    Rows that lost a parent since that snapshot are the next run's to find
    (the repair never touched them); a check that found none is not run again.
    """
    now = timezone.now()
    results: dict[str, tuple[int, list, Any]] = {}
    for check in _orphan_checks():
        progress(f"checking {check.label}")
        if spans is None:
            results[check.key] = _count(check.model, check.condition)
        elif (span := spans.get(check.key)) is None:
            results[check.key] = (0, [], None)  # none found, none repaired
        else:
            results[check.key] = _count(
                check.model,
                f"x.id >= {int(span[0])} AND x.id <= {int(span[1])} "
                f"AND {check.condition}",
            )

    progress("checking artifacts nothing alive keeps")
    unowned = unowned_artifacts(created_before=now - timedelta(seconds=grace_seconds))
    results["unowned_artifacts"] = (
        len(unowned),
        [pk for pk, _ in unowned[:SAMPLE]],
        [pk for pk, _ in unowned],
    )

    progress("checking blob files that no row names")
    cutoff = time.time() - grace_seconds
    blobs = _orphan_blobs(store, cutoff)
    results["orphan_blobs"] = (len(blobs), [s for s, _ in blobs[:SAMPLE]], blobs)
    temps = _stale_temp_files(store, cutoff)
    results["stale_temp_files"] = (len(temps), [p.name for p in temps[:SAMPLE]], temps)

    progress("checking class-1 files of tasks that are gone")
    gone = _gone_task_folders(cutoff)
    results["gone_task_files"] = (
        len(gone),
        [str(path) for _, path in gone[:SAMPLE]],
        [pk for pk, _ in gone],
    )

    if integrity:
        progress("checking every artifact's blob")
        damaged, restored = _integrity_scan(store, verify=verify, progress=progress)
        results["damaged_blobs"] = (
            len(damaged),
            [
                {"id": pk, "state": state}
                for pk, state in list(damaged.items())[:SAMPLE]
            ],
            (damaged, restored),
        )

    progress("checking the data folder's permissions")
    loose = loose_paths() + store.loose_paths() + files_loose_paths()
    results["loose_permissions"] = (
        len(loose),
        [f"{path} ({oct(_mode(path))})" for path, _ in loose[:SAMPLE]],
        loose,
    )

    progress("checking blob unlinks a delete left pending")
    pending = list(PendingUnlink.objects.values_list("sha256", flat=True))
    results["pending_unlinks"] = (len(pending), pending[:SAMPLE], pending)

    progress("checking leases and tool-call envelopes")
    leases = _expired_leases()
    results["expired_leases"] = (len(leases), [pk for pk, _ in leases[:SAMPLE]], leases)
    envelopes = _open_envelopes(now)
    results["open_envelopes"] = (
        len(envelopes),
        [{"task": t, "step": s} for _, t, s in envelopes[:SAMPLE]],
        envelopes,
    )
    return results


LABELS = {
    "unowned_artifacts": ("artifacts nothing alive keeps", True, ""),
    "orphan_blobs": ("blobs no row names (older than the grace period)", True, ""),
    "stale_temp_files": ("stale temp files in blobs/tmp", True, ""),
    "gone_task_files": (
        "class-1 files of tasks that are gone (older than the grace period)",
        True,
        "",
    ),
    "damaged_blobs": (
        "artifacts whose blob is missing or fails its sha",
        False,
        "restore the blob from a backup, or retry/branch the steps that made it; "
        "--repair only flags them (Artifact.integrity)",
    ),
    "pending_unlinks": ("blob unlinks a killed delete left pending", True, ""),
    "loose_permissions": (
        "data files or folders other accounts may read",
        True,
        "--repair makes folders 0700, the database 0600, blob and class-1 files 0400",
    ),
    "expired_leases": ("task leases past expiry", True, ""),
    "open_envelopes": (
        "tool calls left open on tasks no worker will pick up",
        True,
        "--repair sends the step to needs_review for a person to resolve",
    ),
}


def doctor_run(
    *,
    repair: bool = False,
    grace_seconds: int | None = None,
    verify: bool = True,
    store: BlobStore | None = None,
    progress: Progress | None = None,
) -> DoctorReport:
    """Check the database and the blob store (a folder's files or a bucket's
    objects, listed against the rows); with ``repair``, fix what can be fixed
    (see the module docstring for the order) and check again."""
    started = time.perf_counter()
    if grace_seconds is None:
        grace_seconds = getattr(
            settings, "PIPPA_DOCTOR_GRACE_SECONDS", DEFAULT_GRACE_SECONDS
        )
    run = _Run(
        store=store or default_store(),
        grace_seconds=grace_seconds,
        verify=verify,
        progress=progress or (lambda message: None),
    )
    with _one_read():
        before = run.check(integrity=True)
    report = _report(repair, before)
    report.store = run.store.describe()
    if repair:
        repaired = _repair(run, before, report)
        spans = {check.key: before[check.key][2] for check in _orphan_checks()}
        with _one_read():
            after = run.check(integrity=False, spans=spans)
        after["damaged_blobs"] = (_still_damaged(before), [], None)
        _tally(report, after, repaired)
    report.seconds = time.perf_counter() - started
    return report


@dataclass
class _Run:
    store: BlobStore
    grace_seconds: int
    verify: bool
    progress: Progress

    def check(
        self, *, integrity: bool, spans: dict | None = None
    ) -> dict[str, tuple[int, list, Any]]:
        return _check(
            store=self.store,
            grace_seconds=self.grace_seconds,
            verify=self.verify,
            integrity=integrity,
            progress=self.progress,
            spans=spans,
        )


def _report(repair: bool, before: dict) -> DoctorReport:
    report = DoctorReport(repair=repair)
    for check in _orphan_checks():
        report.findings.append(
            Finding(check.key, check.label, fixable=check.fixable, advice=check.advice)
        )
    for key, (label, fixable, advice) in LABELS.items():
        report.findings.append(Finding(key, label, fixable=fixable, advice=advice))
    for finding in report.findings:
        finding.found, finding.sample, _ = before[finding.key]
        finding.remaining = finding.found
    return report


def _repair(run: _Run, before: dict, report: DoctorReport) -> dict[str, int]:
    """Repair what the check found, in the module docstring's order.

    Return {key: repaired} for the findings that count their repairs (the
    orphan checks count what is gone afterwards); the tasks the repair wrote
    to go into ``report.touched_tasks``.
    """
    _repair_orphans(before, run.progress)
    repaired = _repair_artifacts(run, before)
    repaired.update(_repair_blobs(run, before))
    repaired["gone_task_files"] = task_folders_remove(before["gone_task_files"][2])
    repaired["loose_permissions"] = _tighten(before["loose_permissions"][2])
    _flag_integrity(before)
    run.progress("releasing expired leases")
    released = [
        pk for pk, owner in before["expired_leases"][2] if _lease_release(pk, owner)
    ]
    run.progress("closing open tool-call envelopes")
    closed = [e[1] for e in before["open_envelopes"][2] if _envelope_close(*e)]
    repaired["expired_leases"], repaired["open_envelopes"] = len(released), len(closed)
    report.touched_tasks = sorted(set(released) | set(closed))
    return repaired


def _mode(path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0


def _tighten(loose: list) -> int:
    """chmod each loose path to its private mode; return how many changed."""
    done = 0
    for path, mode in loose:
        try:
            os.chmod(path, mode)
        except FileNotFoundError:
            continue
        done += 1
    return done


def _repair_orphans(before: dict, progress: Progress) -> None:
    """Delete rows whose parent is gone, a chunk per short transaction.

    Leaves first (orphan events before their orphan steps), each a set
    delete by id range. PostgreSQL runs FK actions row by row, so the cascade
    from 13,750 orphan steps cost 2 s against 0.2 s for deleting their 98,159
    events directly; on SQLite the leaf deletes paged by id take 0.9 s
    against 1.6 s for the cascade (bench doctor group). Either way, rows
    whose parent is itself an orphan go with that parent.
    """
    checks = _orphan_checks()
    checks.reverse()
    for check in checks:
        found, _, span = before[check.key]
        if check.fixable and found:
            _delete_in_chunks(
                check.model, check.condition, span, check.label, found, progress
            )


def _repair_artifacts(run: _Run, before: dict) -> dict[str, int]:
    run.progress("removing artifacts nothing alive keeps")
    gone = unowned_artifacts_delete(
        created_before=timezone.now() - timedelta(seconds=run.grace_seconds),
        store=run.store,
        only=before["unowned_artifacts"][2],
    )
    run.progress("finishing blob unlinks a delete left pending")
    pending = before["pending_unlinks"][2]
    pending_unlinks_finish(store=run.store, shas=pending)
    left = PendingUnlink.objects.filter(sha256__in=pending).count()
    return {"unowned_artifacts": len(gone), "pending_unlinks": len(pending) - left}


def _repair_blobs(run: _Run, before: dict) -> dict[str, int]:
    run.progress("sweeping blob files that no row names")
    # Under the per-sha guard, re-checking rows and open envelopes: a write
    # that named one of these since the check keeps its file.
    in_flight = _in_flight_payloads()
    orphans = [sha for sha, _ in before["orphan_blobs"][2] if sha not in in_flight]
    removed = blobs_unlink(shas=orphans, store=run.store)
    temps = before["stale_temp_files"][2]
    for path in temps:
        path.unlink(missing_ok=True)
    return {"orphan_blobs": removed, "stale_temp_files": len(temps)}


def _flag_integrity(before: dict) -> None:
    """Mark damaged blobs' rows (never delete them) and clear healed ones."""
    damaged, restored = before["damaged_blobs"][2]
    checked_at = timezone.now()
    for state in (Artifact.Integrity.MISSING, Artifact.Integrity.CORRUPT):
        ids = [pk for pk, s in damaged.items() if s == state]
        for chunk in batched(ids):
            Artifact.objects.filter(pk__in=chunk).update(
                integrity=state, verified_at=checked_at
            )
    for chunk in batched(restored):
        Artifact.objects.filter(pk__in=chunk).update(
            integrity=Artifact.Integrity.OK, verified_at=checked_at
        )


def _still_damaged(before: dict) -> int:
    damaged, _restored = before["damaged_blobs"][2]
    return sum(
        Artifact.objects.filter(pk__in=chunk).count()
        for chunk in batched(list(damaged))
    )


def _tally(report: DoctorReport, after: dict, repaired: dict[str, int]) -> None:
    orphan_keys = {check.key for check in _orphan_checks() if check.fixable}
    for finding in report.findings:
        finding.remaining = after[finding.key][0]
        if finding.key in orphan_keys:
            # Deleting a parent cascades to its children: count both.
            finding.repaired = max(finding.found - finding.remaining, 0)
        else:
            finding.repaired = repaired.get(finding.key, 0)
