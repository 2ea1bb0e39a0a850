"""Faults that are not the tool's: plain reasons, back-off, probes.

Crash points, the faults tests make on purpose, are ``tasks.crashpoints``.

- ``fault_reason`` names a failure of the store or the database in the words a
  person reads on the timeline ("disk full", "the database is locked").
- ``backoff_delay`` is the one back-off rule: exponential, capped, jittered.
  Tool retries and a worker waiting out its database both use it.
- ``store_probe`` says whether the blob folder (and the files root, and an
  SQLite database's folder) can take a write again.
"""

from __future__ import annotations

import errno
import os
import random
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection

from artifacts.quota import REASON_QUOTA, QuotaExceeded
from artifacts.store import PRIVATE_DIR, FolderStore, default_store
from tasks.tools import files_root

# -- reasons ------------------------------------------------------------------

REASON_DISK_FULL = "disk full"
REASON_DB_LOCKED = "the database is locked"
REASON_DB_LOST = "the database connection was lost"
REASON_DB_FAILED = "the database refused the write"
REASON_STORE = "the blob store could not be written"

_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def fault_reason(exc: BaseException) -> str:
    """Name a store or database failure in plain words (with its detail)."""
    if isinstance(exc, QuotaExceeded):
        return str(exc)  # "storage quota reached: …", the quota and the usage
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return REASON_DISK_FULL
    lowered = text.lower()
    if isinstance(exc, DatabaseError):
        if "disk is full" in lowered or "no space left" in lowered:
            return REASON_DISK_FULL
        if "database is locked" in lowered or "database is busy" in lowered:
            return REASON_DB_LOCKED
        if _connection_gone(exc, lowered):
            return REASON_DB_LOST
        return f"{REASON_DB_FAILED}: {text[:200]}"
    if isinstance(exc, OSError):
        return f"{REASON_STORE}: {exc.strerror or text}"[:300]
    return f"{type(exc).__name__}: {text}"[:300]


def _connection_gone(exc: BaseException, lowered: str) -> bool:
    if isinstance(exc, InterfaceError):
        return True
    words = (
        "terminating connection",
        "connection already closed",
        "server closed the connection",
        "connection refused",
        "could not connect",
        "the database system is",  # starting up / shutting down / in recovery
        "consuming input failed",
        "ssl connection has been closed",
        "connection is lost",
        "connection not open",
    )
    return any(w in lowered for w in words)


def worker_waits(reason: str) -> bool:
    """Whether a step's unsaved output is the store's or the database's
    fault, which the worker waits out for every task (backing off, probing);
    an owner's full quota is that owner's, and the step waits for a person."""
    return bool(reason) and not reason.startswith(REASON_QUOTA)


# -- back-off -------------------------------------------------------------------


def backoff_delay(
    failures: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after the n-th failure in a row (n >= 1).

    ``base * 2**(n-1)``, capped at ``cap``, then jittered down to between half
    and all of it ("equal jitter"), so workers that failed together do not
    come back together.
    """
    if base <= 0 or failures <= 0:
        return 0.0
    full = min(cap, base * (2 ** min(failures - 1, 32)))
    return full / 2 + (rng or random).uniform(0, full / 2)


def retry_delay(attempts: int) -> float:
    """Wait before the next attempt of a tool that failed ``attempts`` times."""
    return backoff_delay(
        attempts,
        base=settings.PIPPA_RETRY_BASE_SECONDS,
        cap=settings.PIPPA_RETRY_MAX_SECONDS,
    )


def fault_delay(failures: int) -> float:
    """Wait of a worker after its ``failures``-th store or database fault in a row."""
    return backoff_delay(
        failures,
        base=settings.PIPPA_FAULT_BASE_SECONDS,
        cap=settings.PIPPA_FAULT_MAX_SECONDS,
    )


# -- probes ---------------------------------------------------------------------

PROBE_BYTES = 4096
PROBE_MARGIN = 1024 * 1024  # free space wanted beyond the write that failed


def _probe_folder(folder: Path, needed: int) -> str:
    """Return "" if ``folder`` takes a small durable write and has room, else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)  # a new one: 0700
        stats = os.statvfs(folder)
        free = stats.f_bavail * stats.f_frsize
        if free < needed + PROBE_MARGIN:
            return REASON_DISK_FULL
        fd, name = tempfile.mkstemp(dir=folder, prefix="probe-")
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name)
    except OSError as exc:
        return fault_reason(exc)
    return ""


def store_probe(*, needed: int = 0) -> str:
    """Return "" when the blob store and the database can be written again, else why not.

    The blob folder must take a small fsynced write and have ``needed`` bytes
    (the write that failed) plus a margin free (a bucket must answer, and the
    local folder its writes spool through must have that room); the class-1 files root and an
    SQLite database's folder likewise. The database must answer. A full SQLite
    file shows itself only on a real write: the next step is that write, and
    fails into a longer back-off if the space is still missing.
    """
    store = default_store()
    if isinstance(store, FolderStore):
        reason = _probe_folder(Path(settings.BLOB_DIR) / "tmp", needed)
    else:
        # A bucket: the server must answer, and the local spool take the write.
        reason = _probe_folder(Path(tempfile.gettempdir()), needed)
        try:
            store.check()
        except OSError as exc:
            reason = reason or fault_reason(exc)
    if reason:
        return reason
    # Class-1 tools write under the files root (beside the blobs unless moved).
    reason = _probe_folder(files_root(), 0)
    if reason:
        return reason
    if connection.vendor == "sqlite":
        reason = _probe_folder(Path(connection.settings_dict["NAME"]).parent, 0)
        if reason:
            return reason
    try:
        if not connection.in_atomic_block:
            connection.close()  # reconnect: the old session may be gone
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        if not connection.in_atomic_block:
            connection.close()
        return fault_reason(exc)
    return ""
