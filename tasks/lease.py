"""A task's lease: who may step it now. Take, renew, release, and when it is dead.

One worker at a time steps a task. It holds the lease (``Task.lease_owner``
until ``Task.lease_expires_at``). Every transaction of the executor checks
it: ``lease_take`` at a step's start (which renews it), ``lease_append`` or
``lease_close`` in every later one, each one named statement of
``tasks.statements`` that matches only while this worker holds the lease
(else ``LeaseLost``, and the transaction writes nothing). The
keeper thread renews it while a long tool call runs, and the result's commit
checks it without moving its expiry (``step_done``: a worker that moves on
lets it run out from its last renewal).

**Dead.** A lease is dead when nobody holds it, or its holder has no expiry,
or the expiry has passed: one table, ``tasks.models.LEASE_DEAD_WHEN``, from
which ``lease_dead`` (one row's values, as ``lease_take`` reads them and
``Task.lease_live`` answers), ``lease_dead_q`` (``TaskQuerySet.lease_dead()``)
and ``LEASE_DEAD`` (the named statements' SQL) are built. A holder with no
expiry cannot be renewed by anybody (every renewal writes an expiry), so it
is a dead worker's: any worker may take it over, and the doctor and the
admin call it stale.

**Release.** Every release leaves the task not running, so a worker's next
poll finds it: ``lease_close`` is the holder's own release on the hot path
(with the status the step decided: done, failed, needs review or queued);
at the step boundary of a person's pause or cancel the holder gives it back
in ``lease_take``; ``lease_release`` is everyone else's (the worker loop, a
runner that stops, a person, the doctor), and puts a running task back to
queued. Each logs ``lease_released``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from pippa_site import metrics
from pippa_site.errors import LeaseConflict
from tasks import statements as sql
from tasks.faults import fault_reason
from tasks.models import Event, Task, lease_dead
from tasks.services import events_append
from tasks.statements import parse_dt

log = logging.getLogger("pippa.executor")

ERR_LEASE_HELD = "a worker ({owner}) holds this task's lease until {until}; wait, or force the release"

T = Task.Status

Entry = tuple[str, int | None, dict[str, Any]]


class LeaseLost(RuntimeError):
    """Another worker took the lease: this worker must not record anything."""


@dataclass
class Lease:
    """What taking the lease read: progress, and the events taking it owes the log."""

    steps_total: int
    steps_done: int
    entries: list[Entry] = field(default_factory=list)
    # Sequence numbers the renewal reserved (``reserve``), ending at last_seq.
    reserved: int = 0
    last_seq: int = 0


def lease_until():
    return timezone.now() + timedelta(seconds=settings.PIPPA_LEASE_SECONDS)


# -- the holder: take, renew-and-append, close (the hot path, tasks.statements) -----


def lease_take(cur, task_id: int, worker_id: str, *, reserve: int = 0) -> Lease | None:
    """Take or renew the task's lease with conditional UPDATEs; None if it is
    not this worker's to take.

    1. Renewal, the common case: one statement for our running task
       (``LEASE_RENEW``), a second for our queued one, which it sets running
       (``LEASE_RENEW_QUEUED``). It also reserves ``reserve`` event seqs
       (``Lease.reserved``) for the caller's first append; a caller that
       does not use them gives them back (``SEQS_GIVE_BACK``).
    2. Otherwise read the holder. A task a person paused or cancelled while
       this worker held it: the call in flight has finished and is saved,
       and at this step boundary the worker gives the lease back
       (``lease_released``). A live lease of another worker is refused.
    3. A dead lease is taken over (``lease_taken_over`` names the previous
       owner), a free one taken (``lease_taken``); the UPDATE re-checks both.
    """
    now = timezone.now()
    stamp, until = sql.db_datetime(now), sql.db_datetime(lease_until())
    cur.execute(sql.LEASE_RENEW, [reserve, stamp, until, task_id, worker_id, T.RUNNING])
    row = cur.fetchone()
    if row is None:
        cur.execute(
            sql.LEASE_RENEW_QUEUED,
            [reserve, stamp, until, T.RUNNING, task_id, worker_id, T.QUEUED],
        )
        row = cur.fetchone()
    if row is not None:
        return Lease(row[2], row[1], reserved=reserve, last_seq=row[0])
    cur.execute(sql.LEASE_READ, [task_id])
    row = cur.fetchone()
    if row is None:
        return None
    status, previous, expires = row
    if status in (T.PAUSED, T.CANCELLED) and previous == worker_id:
        _release_stopped(cur, task_id, worker_id)
        return None
    expires_at = parse_dt(expires)
    if status not in (T.QUEUED, T.RUNNING) or not lease_dead(previous, expires_at, now):
        return None
    cur.execute(
        sql.LEASE_TAKE,
        [
            worker_id,
            until,
            T.RUNNING,
            stamp,
            task_id,
            previous,
            stamp,
            T.QUEUED,
            T.RUNNING,
        ],
    )
    row = cur.fetchone()
    if row is None:
        return None
    if previous:
        transaction.on_commit(metrics.lease_taken_over)  # counted once it holds
        entry: Entry = (
            Event.Kind.LEASE_TAKEN_OVER,
            None,
            {
                "worker": worker_id,
                "previous_owner": previous,
                "expired_at": expires_at.isoformat() if expires_at else None,
            },
        )
    else:
        entry = (Event.Kind.LEASE_TAKEN, None, {"worker": worker_id})
    return Lease(row[0], row[1], [entry])


def _release_stopped(cur, task_id: int, worker_id: str) -> None:
    """The holder's release at the step boundary of a person's pause or cancel."""
    cur.execute(sql.LEASE_CLEAR_STOPPED, [task_id, worker_id, T.PAUSED, T.CANCELLED])
    row = cur.fetchone()
    if row is not None:
        released = {"worker": worker_id, "reason": row[0]}
        sql.events_write(
            cur,
            sql.SEQS_RESERVE,
            [task_id],
            task_id=task_id,
            entries=[(Event.Kind.LEASE_RELEASED, None, released)],
        )


def lease_append(
    cur,
    task_id: int,
    worker_id: str,
    entries: list[Entry],
    *,
    step_done: bool = False,
) -> tuple:
    """Append events under the lease, if it is still ``worker_id``'s; return
    (last_seq, steps_done, steps_total).

    One ``UPDATE … RETURNING`` reserves the seqs and checks the lease:
    ``SEQS_HELD`` also renews it; with ``step_done`` (the result's commit,
    right after a call the lease keeper renewed through) ``SEQS_STEP_DONE``
    advances the plan and leaves the expiry where it is, so a worker that
    moves on lets it run out from its last renewal. Raise ``LeaseLost`` when
    another worker holds the lease now.
    """
    stamp = sql.db_datetime(timezone.now())
    if step_done:
        statement, params = sql.SEQS_STEP_DONE, [stamp, task_id, worker_id]
    else:
        until = sql.db_datetime(lease_until())
        statement, params = sql.SEQS_HELD, [stamp, until, task_id, worker_id]
    return _write_held(cur, statement, params, task_id, worker_id, entries)


def lease_close(
    cur,
    task_id: int,
    worker_id: str,
    status: str,
    pre: list[Entry],
    *,
    reason: str = "",
) -> tuple:
    """The holder's release: set the task's next status, log, give the lease
    back, in one statement (``LEASE_CLOSE``) and the events' INSERT.

    ``status`` is never running: done and failed are final, needs review
    waits for a person, queued waits for the next poll (a back-off, say).
    A person's cancel (or, against a re-queue, pause) made meanwhile stands.
    Return (last_seq, steps_done, steps_total); raise ``LeaseLost`` when
    another worker holds the lease now.
    """
    entries = list(pre)
    if status == T.DONE:
        entries.append((Event.Kind.TASK_FINISHED, None, {"status": status}))
    released = {"worker": worker_id, "reason": reason or status}
    entries.append((Event.Kind.LEASE_RELEASED, None, released))
    finished = timezone.now() if status in (T.DONE, T.FAILED) else None
    kept = (T.CANCELLED, T.PAUSED) if status == T.QUEUED else (T.CANCELLED,) * 2
    params = [
        sql.db_datetime(timezone.now()),
        *kept,
        status,
        T.CANCELLED,
        sql.db_datetime(finished),
        task_id,
        worker_id,
    ]
    return _write_held(cur, sql.LEASE_CLOSE, params, task_id, worker_id, entries)


def _write_held(cur, statement, params, task_id, worker_id, entries) -> tuple:
    """Run a holder's seq statement and insert ``entries``; ``LeaseLost``
    when it matched nothing (another worker holds the lease now)."""
    row = sql.events_write(cur, statement, params, task_id=task_id, entries=entries)
    if row is None:
        raise LeaseLost(f"task {task_id}: lease no longer held by {worker_id}")
    return row


@contextmanager
def lease_lent(*, task_id: int, holder: str) -> Iterator[None]:
    """Hold the lease under ``holder`` for one write of the hot path, then clear it.

    An operator's "adopt" records the persisted payload through the
    executor's own result transaction, which writes only under a held
    lease. The caller holds the task's row lock, so no worker is refused.
    """
    Task.objects.filter(pk=task_id).update(
        lease_owner=holder, lease_expires_at=lease_until()
    )
    yield
    Task.objects.filter(pk=task_id, lease_owner=holder).update(
        lease_owner="", lease_expires_at=None
    )


# -- everyone else's release ---------------------------------------------------


def lease_refuse_live(task: Task, actor: str = "") -> None:
    """Raise ``LeaseConflict`` if someone other than ``actor`` holds a live lease."""
    if task.lease_held_by_other(actor):
        raise LeaseConflict(
            ERR_LEASE_HELD.format(
                owner=task.lease_owner, until=task.lease_expires_at.isoformat()
            )
        )


def lease_drop(
    locked: Task, *, actor: str, forced: bool, reason: str = ""
) -> list[Entry]:
    """Clear the lease of a task the caller has locked; a running task is queued.

    Return the ``lease_released`` entry for the caller's own append, so an
    action logs the release and its own event in one go.
    """
    if not locked.lease_owner:
        return []
    data: dict[str, Any] = {
        "previous_owner": locked.lease_owner,
        "actor": actor,
        "forced": forced,
    }
    if reason:
        data["reason"] = reason
    changes: dict[str, Any] = {
        "lease_owner": "",
        "lease_expires_at": None,
        "updated_at": timezone.now(),
    }
    if locked.status == Task.Status.RUNNING:
        changes["status"] = Task.Status.QUEUED
    Task.objects.filter(pk=locked.pk).update(**changes)
    # The caller's copy loses the lease; its status is the caller's to set.
    locked.lease_owner, locked.lease_expires_at = "", None
    return [(Event.Kind.LEASE_RELEASED, None, data)]


@transaction.atomic
def lease_release(
    *,
    task: Task,
    actor: str = "",
    force: bool = False,
    owner: str | None = None,
    dead_only: bool = False,
    reason: str = "",
) -> bool:
    """Release a task's lease; return whether there was one to release.

    1. Lock the task. Nothing held, or not by ``owner`` when given, or (with
       ``dead_only``) held live: nothing to do.
    2. A live lease held by someone other than ``actor`` is refused
       (``LeaseConflict``) unless ``force``.
    3. Clear it, queue a running task again, log ``lease_released``.
    """
    locked = Task.objects.select_for_update().get(pk=task.pk)
    if not locked.lease_owner or (owner is not None and locked.lease_owner != owner):
        return False
    live = locked.lease_live
    if dead_only and live:
        return False
    if live and not force:
        lease_refuse_live(locked, actor)
    forced = bool(force and live and actor != locked.lease_owner)
    entries = lease_drop(locked, actor=actor, forced=forced, reason=reason)
    events_append(task_id=locked.pk, entries=entries)
    task.refresh_from_db()
    return True


def lease_release_own(*, task: Task, worker_id: str) -> bool:
    """Give back the lease ``worker_id`` holds (a runner that stops early).

    Another worker's live lease is left alone: False, not an error.
    """
    try:
        return lease_release(task=task, actor=worker_id, force=False)
    except LeaseConflict:
        return False


def door_worker_id(*, door: str, user, worker: str) -> str:
    """The lease name of a runner reaching Pippa through ``door`` (api, mcp).

    The user's name is part of it, so two users' runners never share a lease
    even when they call themselves the same.
    """
    return f"{door}:{user.get_username()}:{worker}"


# -- the keeper: renews held leases while a long tool call runs -----------------


class _LeaseKeeper:
    """One daemon thread per process renewing the leases of calls in flight."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.held: dict[tuple[int, str], bool] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread = threading.Thread(
            target=self._run, daemon=True, name="pippa-lease"
        )
        self.thread.start()

    def _run(self) -> None:
        while True:
            interval = max(0.2, settings.PIPPA_LEASE_SECONDS / 3)
            self.wake.wait(interval)
            self.wake.clear()
            with self.lock:
                held = [k for k, lost in self.held.items() if not lost]
            for task_id, worker_id in held:
                self._renew(task_id, worker_id)
            # A renewal every few seconds does not need a standing connection,
            # and one left open would keep a PostgreSQL backend (and its
            # database) busy after the worker is done. ``connection`` is this
            # thread's own: Django's connections are per thread.
            connection.close()

    def _renew(self, task_id: int, worker_id: str) -> None:
        try:
            with transaction.atomic(durable=True):
                lease_append(
                    sql.cursor(),
                    task_id,
                    worker_id,
                    [(Event.Kind.LEASE_RENEWED, None, {"worker": worker_id})],
                )
        except LeaseLost:
            with self.lock:
                if (task_id, worker_id) in self.held:
                    self.held[(task_id, worker_id)] = True
        except DatabaseError as exc:
            # One line, no traceback: the worker logs the fault itself.
            log.warning(
                "lease renewal failed for task %s: %s", task_id, fault_reason(exc)
            )
            connection.close()
        except Exception:  # noqa: BLE001 - a failed renewal is retried next round
            log.exception("lease renewal failed for task %s", task_id)

    def hold(self, task_id: int, worker_id: str) -> None:
        with self.lock:
            self.held[(task_id, worker_id)] = False

    def drop(self, task_id: int, worker_id: str) -> bool:
        """Stop renewing; return True if the lease was lost meanwhile."""
        with self.lock:
            return self.held.pop((task_id, worker_id), False)


_keeper: _LeaseKeeper | None = None


def lease_keeper() -> _LeaseKeeper:
    """This process's keeper thread (a new one after a fork)."""
    global _keeper
    if _keeper is None or _keeper.pid != os.getpid():
        _keeper = _LeaseKeeper()
    return _keeper
