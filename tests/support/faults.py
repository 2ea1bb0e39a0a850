"""Real faults for tests: a small tmpfs that fills up, dropped PostgreSQL sessions.

``Tmpfs`` mounts a size-capped tmpfs (root only; ``Tmpfs.mount`` raises
``TmpfsUnavailable`` where mounting is not permitted, and the fixture skips).
``fill()`` writes zeros until the kernel says ENOSPC; ``free()`` removes them.
``fill_once(path)`` is what the test tools call (``fill=PATH``): the first
call fills the disk under PATH, later calls do nothing, so a resumed call does
not fill it again after the test has freed it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid
from pathlib import Path

CHUNK = 64 * 1024


class TmpfsUnavailable(RuntimeError):
    pass


def fill(path: Path) -> int:
    """Write zeros to ``path`` until the disk is full; return the bytes written."""
    written = 0
    block = b"\0" * CHUNK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = CHUNK
        while size:
            try:
                written += os.write(fd, block[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2  # squeeze the last partial block in too
    finally:
        os.close(fd)
    return written


def fill_once(path: str) -> None:
    """Fill the disk under ``path`` the first time only (a marker remembers)."""
    target = Path(path)
    marker = target.with_name(target.name + ".filled")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    fill(target)


class Tmpfs:
    """A tmpfs of ``size`` bytes at ``root``; ``filler`` is the file that fills it."""

    def __init__(self, root: Path, size: int):
        self.root = Path(root)
        self.size = size
        self.filler = self.root / f"filler-{uuid.uuid4().hex[:8]}"
        self.mounted = False

    def mount(self) -> Tmpfs:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            raise TmpfsUnavailable("mounting a tmpfs needs root")
        proc = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.size}",
                "tmpfs",
                str(self.root),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise TmpfsUnavailable(proc.stderr.strip() or "mount refused")
        self.mounted = True
        return self

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
            self.mounted = False

    def fill(self) -> int:
        return fill(self.filler)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize


def pg_wait_sessions_gone(
    connection, application_name: str, timeout: float = 30.0
) -> None:
    """Wait until no session named ``application_name`` is left on this
    PostgreSQL database. A client SIGKILLed with its COMMIT in flight leaves
    the server to finish that transaction after the client is gone; once its
    session has ended, whatever it was doing has committed or rolled back."""
    deadline = time.monotonic() + timeout
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND application_name = %s"
    )
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [application_name])
            if cursor.fetchone()[0] == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"sessions named {application_name!r} still open after {timeout:g} s"
            )
        time.sleep(0.01)


def pg_terminate_others(connection, *, application_name: str = "") -> int:
    """End every other session on this PostgreSQL database (only those with
    this ``application_name``, if given); return how many."""
    sql = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    params: list[str] = []
    if application_name:
        sql += " AND application_name = %s"
        params.append(application_name)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]
