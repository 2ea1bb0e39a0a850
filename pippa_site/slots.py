"""What one user may hold in flight in a web process, and what all users may.

A step run asked over the API or MCP runs a brain's tool, which may take
seconds or minutes. Each user may have at most ``PIPPA_STEP_RUNS_PER_USER`` of
them running at once in a web process (past it: 429 with ``Retry-After``),
and the process runs at most ``PIPPA_STEP_RUNS`` for everyone (past it: 503
with ``Retry-After``). A step run never takes a thread a page needs: Django's
handler runs every request on a thread of its own, and MCP's step runs run
on threads of their own, not the tool threads (``pippa_mcp.door.in_thread``).
``PIPPA_MCP_CALLS_PER_USER`` bounds each user's MCP calls in flight the same
way (``pippa_mcp.asgi``), whichever of the user's tokens they come with.

The counts are per process (gunicorn runs one web process per two cores),
kept in memory, and given back when a call ends however it ends.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from pippa_site.errors import Busy, TooMany

ERR_USER = "you already have {limit} {what} in flight; try again when one ends"
ERR_ALL = "the server is running {limit} {what} at once; try again shortly"


class Slots:
    """A per-user and an overall bound on calls in flight (thread-safe)."""

    def __init__(
        self, what: str, *, per_user: str, overall: str | None, retry_after: int
    ):
        self.what = what
        self.per_user = per_user  # the settings' names, read at each call
        self.overall = overall
        self.retry_after = retry_after
        self.held: Counter[int] = Counter()
        self.lock = threading.Lock()

    @contextmanager
    def hold(self, user_id: int) -> Iterator[None]:
        """Hold one of ``user_id``'s slots while the block runs, or raise
        ``TooMany`` (429) / ``Busy`` (503) at once."""
        self.take(user_id)
        try:
            yield
        finally:
            self.give_back(user_id)

    def take(self, user_id: int) -> None:
        per_user = getattr(settings, self.per_user)
        overall = getattr(settings, self.overall) if self.overall else None
        with self.lock:
            if self.held[user_id] >= per_user:
                raise TooMany(
                    ERR_USER.format(limit=per_user, what=self.what),
                    retry_after=self.retry_after,
                )
            if overall is not None and self.held.total() >= overall:
                raise Busy(
                    ERR_ALL.format(limit=overall, what=self.what),
                    retry_after=self.retry_after,
                )
            self.held[user_id] += 1

    def give_back(self, user_id: int) -> None:
        with self.lock:
            self.held[user_id] -= 1
            if self.held[user_id] <= 0:
                del self.held[user_id]


STEP_RUNS = Slots(
    "step runs",
    per_user="PIPPA_STEP_RUNS_PER_USER",
    overall="PIPPA_STEP_RUNS",
    retry_after=5,
)
MCP_CALLS = Slots(
    "MCP calls", per_user="PIPPA_MCP_CALLS_PER_USER", overall=None, retry_after=1
)
