"""What one user may hold in flight on a host, and what all users may.

A step run asked over the API or MCP runs a brain's tool, which may take
seconds or minutes. Each user may have at most ``PIPPA_STEP_RUNS_PER_USER`` of
them running at once on a host (past it: 429 with ``Retry-After``), and the
host runs at most ``PIPPA_STEP_RUNS`` for everyone (past it: 503 with
``Retry-After``). A step run never takes a thread a page needs: Django's
handler runs every request on a thread of its own while it runs (an idle one
of ``pippa_site.request_threads``, or a new one), and MCP's step runs run
on threads of their own, not the tool threads (``pippa_mcp.door.in_thread``).
``PIPPA_MCP_CALLS_PER_USER`` bounds each user's MCP calls in flight the same
way (``pippa_mcp.asgi``), whichever of the user's tokens they come with.

The counts hold for every web process of the host together (gunicorn runs
several): a slot is an exclusive ``flock(2)`` on one of N files in the host's
slots folder (``PIPPA_SLOTS_DIR``), a call in flight holds one of its user's
and, for step runs, one of everyone's. The system gives a lock back when its
file is closed, so a call gives its slots back however it ends, even with its
process killed. Several hosts each count their own.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from pippa_site.errors import Busy, TooMany

ERR_USER = "you already have {limit} {what} in flight; try again when one ends"
ERR_ALL = "the server is running {limit} {what} at once; try again shortly"


@dataclass
class Ticket:
    """The slots one call holds: its user's, and everyone's where bounded."""

    user_id: int
    files: list[int] = field(default_factory=list)  # locked file descriptors


def _lock_one(folder: Path, prefix: str, count: int) -> int | None:
    """Lock the first free of ``count`` slot files; return its descriptor, or
    None when all are held (by any process of the host)."""
    for number in range(count):
        fd = os.open(
            folder / f"{prefix}.{number}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd
    return None


class Slots:
    """A per-user and an overall bound on calls in flight on this host."""

    def __init__(
        self, what: str, *, per_user: str, overall: str | None, retry_after: int
    ):
        self.what = what
        self.per_user = per_user  # the settings' names, read at each call
        self.overall = overall
        self.retry_after = retry_after
        # This process's share, by user (what its tests and pages may read).
        self.held: Counter[int] = Counter()
        self.lock = threading.Lock()

    @contextmanager
    def hold(self, user_id: int) -> Iterator[None]:
        """Hold one of ``user_id``'s slots while the block runs, or raise
        ``TooMany`` (429) / ``Busy`` (503) at once."""
        ticket = self.take(user_id)
        try:
            yield
        finally:
            self.give_back(ticket)

    def folder(self) -> Path:
        path = Path(settings.PIPPA_SLOTS_DIR) / self.what.replace(" ", "-")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def take(self, user_id: int) -> Ticket:
        """Take one of ``user_id``'s slots (and one of everyone's), or raise
        ``TooMany`` / ``Busy`` with nothing held."""
        per_user = getattr(settings, self.per_user)
        overall = getattr(settings, self.overall) if self.overall else None
        folder = self.folder()
        mine = _lock_one(folder, f"user-{user_id}", per_user)
        if mine is None:
            raise TooMany(
                ERR_USER.format(limit=per_user, what=self.what),
                retry_after=self.retry_after,
            )
        ticket = Ticket(user_id=user_id, files=[mine])
        if overall is not None:
            every = _lock_one(folder, "all", overall)
            if every is None:
                os.close(mine)
                raise Busy(
                    ERR_ALL.format(limit=overall, what=self.what),
                    retry_after=self.retry_after,
                )
            ticket.files.append(every)
        with self.lock:
            self.held[user_id] += 1
        return ticket

    def give_back(self, ticket: Ticket) -> None:
        """Give a call's slots back (closing a file gives its lock back)."""
        files, ticket.files = ticket.files, []
        if not files:
            return  # given back already
        for fd in files:
            os.close(fd)
        with self.lock:
            self.held[ticket.user_id] -= 1
            if self.held[ticket.user_id] <= 0:
                del self.held[ticket.user_id]


STEP_RUNS = Slots(
    "step runs",
    per_user="PIPPA_STEP_RUNS_PER_USER",
    overall="PIPPA_STEP_RUNS",
    retry_after=5,
)
MCP_CALLS = Slots(
    "MCP calls", per_user="PIPPA_MCP_CALLS_PER_USER", overall=None, retry_after=1
)
