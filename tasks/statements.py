"""The step's SQL: one module of named statements.

Every statement the step's hot path and its lease run is a constant here
(the event INSERT, one row per event, is the one builder: ``events_insert``),
next to what it does. No status is spelled in SQL: each is a parameter bound
from the models' ``TextChoices`` (``Step.Status``, ``Task.Status``).
``tests/tasks/test_statements.py`` pairs each statement with its ORM spelling
and checks that both leave the database the same.

**Event seqs.** ``Task.last_seq`` is the last event number handed out. Only
the statements named ``SEQS_*`` and ``LEASE_RENEW*``/``LEASE_CLOSE`` write
it; each that reserves is one ``UPDATE … RETURNING last_seq, steps_done,
steps_total`` whose first parameter is how many numbers it reserves
(``SEQS_GIVE_BACK`` returns unused ones), in the caller's transaction:
the row lock (PostgreSQL) or the write lock (SQLite, IMMEDIATE) orders
appenders, and a rollback returns the numbers with the events, so no gap
appears. ``events_write`` runs one of them and inserts the events under the
numbers it reserved.

The statements run on Django's own cursor (``connection.cursor()``), as
Django's docs describe for raw SQL: its placeholders (``%s``), its error
wrapping, its query log (``DEBUG``, ``CaptureQueriesContext``), the
``django.db.backends`` logger and ``connection.execute_wrapper()`` hooks see
every one of them. ``transaction.atomic`` opens and commits the transaction.
A datetime parameter is adapted the way Django adapts a ``DateTimeField``'s
value for its backend (``db_datetime``: naive UTC text on SQLite).

``synchronous`` sets SQLite's sync level for one transaction (SQLite refuses
to change ``PRAGMA synchronous`` inside one: "Safety level may not be changed
inside a transaction").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from tasks.models import LEASE_DEAD, Conversation, Event, Step, Task, TaskArtifact

S = Step.Status

T_TASK = Task._meta.db_table
T_CONV = Conversation._meta.db_table
T_STEP = Step._meta.db_table
T_LINK = TaskArtifact._meta.db_table
T_EVENT = Event._meta.db_table

ERR_EVENT_DATA_TOO_LARGE = "event data must stay small (refs and sizes, not payloads)"
MAX_EVENT_DATA_CHARS = 4096


def db_datetime(value):
    """``value`` as Django's backend adapts a ``DateTimeField``'s value for its
    driver (naive UTC text on SQLite, the datetime itself on PostgreSQL)."""
    return connection.ops.adapt_datetimefield_value(value)


def cursor():
    """Django's cursor of the default connection (``connection.cursor()``)."""
    return connection.cursor()


def parse_dt(value):
    """A datetime as read by the driver (text on SQLite) -> an aware datetime."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


# -- the step ----------------------------------------------------------------------

# The columns of the executor's step row (``StepRow``), in this
# order, then the conversation owner's id (the owner of every artifact row a
# step writes).
STEP_COLUMNS = (
    "id",
    "position",
    "title",
    "status",
    "tool",
    "args",
    "artifact_class",
    "side_effects",
    "attempts",
    "max_attempts",
    "generation",
    "next_attempt_at",
)


@dataclass
class StepRow:
    """The step row ``STEP_NEXT`` and ``STEP_START_NEXT`` return: what the
    executor knows of the step it runs (``tasks.executor.step_row`` builds it)."""

    id: int
    task_id: int
    position: int
    title: str
    status: str
    tool: str
    args: dict[str, Any]
    artifact_class: int
    side_effects: bool
    attempts: int
    max_attempts: int
    generation: int
    next_attempt_at: Any
    owner_id: int

    @property
    def key(self) -> str:
        """The call's idempotency key: only an explicit retry bumps the generation."""
        return f"pippa:{self.task_id}:{self.id}:{self.generation}"


_STEP_COLS = ", ".join(STEP_COLUMNS)
_OWNER_OF_TASK = (
    f"(SELECT c.owner_id FROM {T_TASK} t JOIN {T_CONV} c "
    f"ON c.id = t.conversation_id WHERE t.id = %s)"
)
# What "finished" means is Step.Status's; a statement binds FINISHED's values.
FINISHED = S.finished()
_NOT_FINISHED = f"status NOT IN ({', '.join(['%s'] * len(FINISHED))})"

# The first step of a task that is not done or skipped, with its owner.
STEP_NEXT = (
    f"SELECT {', '.join('s.' + c for c in STEP_COLUMNS)}, c.owner_id "
    f"FROM {T_STEP} s JOIN {T_TASK} t ON t.id = s.task_id "
    f"JOIN {T_CONV} c ON c.id = t.conversation_id "
    f"WHERE s.task_id = %s AND s.{_NOT_FINISHED} ORDER BY s.position LIMIT 1"
)
# Whether that step has outside effects: read before commit 1 on SQLite,
# whose sync level for a transaction is set before it begins.
STEP_NEXT_EFFECTS = (
    f"SELECT side_effects FROM {T_STEP} WHERE task_id = %s AND {_NOT_FINISHED} "
    f"ORDER BY position LIMIT 1"
)
# The common case in one statement: the next step, if it is pending, due and
# has attempts left, counts an attempt and runs.
STEP_START_NEXT = (
    f"UPDATE {T_STEP} SET status = %s, attempts = attempts + 1, started_at = %s, "
    f"finished_at = NULL, next_attempt_at = NULL "
    f"WHERE id = (SELECT id FROM {T_STEP} WHERE task_id = %s AND {_NOT_FINISHED} "
    f"ORDER BY position LIMIT 1) "
    f"AND status = %s AND attempts < max_attempts "
    f"AND (next_attempt_at IS NULL OR next_attempt_at <= %s) "
    f"RETURNING {_STEP_COLS}, {_OWNER_OF_TASK}"
)
# A step picked otherwise (an uncertain one called again) counts an attempt.
STEP_START = (
    f"UPDATE {T_STEP} SET status = %s, attempts = attempts + 1, started_at = %s, "
    f"finished_at = NULL, next_attempt_at = NULL WHERE id = %s"
)
# Out of attempts.
STEP_FAIL = f"UPDATE {T_STEP} SET status = %s, finished_at = %s WHERE id = %s"
# A failed attempt: pending again (after a back-off) or failed.
STEP_ATTEMPT_FAILED = (
    f"UPDATE {T_STEP} SET status = %s, error = %s, finished_at = %s, "
    f"next_attempt_at = %s WHERE id = %s"
)
# The result: the step names its output and is done.
STEP_DONE = (
    f"UPDATE {T_STEP} SET status = %s, output_id = %s, finished_at = %s, "
    f"error = '' WHERE id = %s"
)
# The one place a step starts waiting for a person (an open envelope the
# class rules hand over). A notification of the owner belongs in the same
# transaction as this statement: ``tasks.executor.step_needs_review``.
STEP_NEEDS_REVIEW = f"UPDATE {T_STEP} SET status = %s, error = %s WHERE id = %s"
# The task keeps the step's output.
LINK_PERSISTED = (
    f"INSERT INTO {T_LINK} (artifact_id, task_id, step_id, role, created_at) "
    f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT (task_id, artifact_id, role) DO NOTHING"
)

# -- event seqs and the lease ------------------------------------------------------

_SEQS = "last_seq = last_seq + %s"
_RETURNING = "RETURNING last_seq, steps_done, steps_total"

# Anyone's reservation (``tasks.services.events_append``): count, task.
SEQS_RESERVE = f"UPDATE {T_TASK} SET {_SEQS} WHERE id = %s {_RETURNING}"
# The holder's append, only while it holds the lease, renewing it: count,
# now, the new expiry, task, holder.
SEQS_HELD = (
    f"UPDATE {T_TASK} SET {_SEQS}, updated_at = %s, lease_expires_at = %s "
    f"WHERE id = %s AND lease_owner = %s {_RETURNING}"
)
# The result's: the plan advances, the lease is checked and its expiry left
# alone (no index entry rewritten): count, now, task, holder.
SEQS_STEP_DONE = (
    f"UPDATE {T_TASK} SET {_SEQS}, updated_at = %s, steps_done = steps_done + 1 "
    f"WHERE id = %s AND lease_owner = %s {_RETURNING}"
)
# Give back seqs a renewal reserved and nothing used: count, task.
SEQS_GIVE_BACK = f"UPDATE {T_TASK} SET last_seq = last_seq - %s WHERE id = %s"

# The step's renewal of its own lease on a running task: count, now, the new
# expiry, task, holder, running. Its status column is left alone.
LEASE_RENEW = (
    f"UPDATE {T_TASK} SET {_SEQS}, updated_at = %s, lease_expires_at = %s "
    f"WHERE id = %s AND lease_owner = %s AND status = %s {_RETURNING}"
)
# The same for a queued task, which it sets running: count, now, the new
# expiry, running, task, holder, queued.
LEASE_RENEW_QUEUED = (
    f"UPDATE {T_TASK} SET {_SEQS}, updated_at = %s, lease_expires_at = %s, "
    f"status = %s WHERE id = %s AND lease_owner = %s AND status = %s {_RETURNING}"
)
# A dead lease (``tasks.models.LEASE_DEAD``: one parameter, now): read it,
# then take it; the UPDATE re-checks the previous holder and the deadness.
LEASE_READ = f"SELECT status, lease_owner, lease_expires_at FROM {T_TASK} WHERE id = %s"
LEASE_TAKE = (
    f"UPDATE {T_TASK} SET lease_owner = %s, lease_expires_at = %s, status = %s, "
    f"updated_at = %s WHERE id = %s AND lease_owner = %s AND {LEASE_DEAD} "
    f"AND status IN (%s, %s) RETURNING steps_total, steps_done"
)
# The holder's release with the status its step decided: count, now, the two
# statuses a person set that stand, the status, cancelled, finished_at, task,
# holder. A person's cancel (or pause, against a mere re-queue) made while the
# lease was held stands: the worker's bookkeeping does not undo it.
LEASE_CLOSE = (
    f"UPDATE {T_TASK} SET {_SEQS}, updated_at = %s, "
    f"status = CASE WHEN status IN (%s, %s) THEN status ELSE %s END, "
    f"finished_at = CASE WHEN status = %s THEN finished_at ELSE %s END, "
    f"lease_owner = '', lease_expires_at = NULL "
    f"WHERE id = %s AND lease_owner = %s {_RETURNING}"
)
# The holder's release at the step boundary of a person's pause or cancel.
LEASE_CLEAR_STOPPED = (
    f"UPDATE {T_TASK} SET lease_owner = '', lease_expires_at = NULL "
    f"WHERE id = %s AND lease_owner = %s AND status IN (%s, %s) RETURNING status"
)


def events_write(
    cur,
    statement: str,
    params: list,
    *,
    task_id: int,
    entries: list[tuple[str, int | None, dict[str, Any] | None]],
) -> tuple | None:
    """Reserve seqs for ``entries`` with ``statement`` (one of the seq
    statements above; ``params`` are its parameters after the count), then
    insert the events under them. Return the statement's row, or None when
    no row matched and nothing was written.
    """
    cur.execute(statement, [len(entries), *params])
    row = cur.fetchone()
    if row is not None and entries:
        events_insert(
            task_id=task_id,
            first_seq=row[0] - len(entries) + 1,
            entries=entries,
            created_at=timezone.now(),
        )
    return row


def _encode_data(data: dict[str, Any] | None) -> str:
    encoded = json.dumps(data or {}, default=str)
    if len(encoded) > MAX_EVENT_DATA_CHARS:
        raise ValueError(ERR_EVENT_DATA_TOO_LARGE)
    return encoded


def events_insert(
    *,
    task_id: int,
    first_seq: int,
    entries: list[tuple[str, int | None, dict[str, Any] | None]],
    created_at,
    returning: bool = False,
) -> list[int]:
    """INSERT events numbered from ``first_seq`` (reserved by a seq statement)
    in one statement; the only writer of event rows. With ``returning`` the
    new ids come back in insert order."""
    created = db_datetime(created_at)
    json_param = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    values = ", ".join([f"(%s, %s, %s, %s, {json_param}, %s)"] * len(entries))
    params: list = []
    for i, (kind, step_id, data) in enumerate(entries):
        params += [task_id, step_id, first_seq + i, str(kind), _encode_data(data)]
        params.append(created)
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {T_EVENT} (task_id, step_id, seq, kind, data, created_at) "
            f"VALUES {values}{' RETURNING id' if returning else ''}",
            params,
        )
        # Ids are handed out in insert order; RETURNING's row order is not.
        return sorted(row[0] for row in cur.fetchall()) if returning else []


# -- SQLite's sync level, one transaction at a time ----------------------------------


def _configured_level() -> str:
    options = settings.DATABASES[DEFAULT_DB_ALIAS].get("OPTIONS", {})
    return _level_in(options.get("init_command", ""))


@lru_cache(maxsize=8)
def _level_in(init_command: str) -> str:
    match = re.search(r"synchronous\s*=\s*(\w+)", init_command)
    return match.group(1).upper() if match else "FULL"


@contextmanager
def synchronous(level: str) -> Iterator[None]:
    """Run the transaction inside at SQLite's ``synchronous=level``, then set
    the connection back to its configured level. No-op on PostgreSQL (its
    worker connections run with ``synchronous_commit`` on) and when the
    level is the configured one. Call it outside any transaction."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "sqlite" or db.in_atomic_block:
        yield
        return
    configured = _configured_level()
    if level == configured:
        yield
        return
    with db.cursor() as cur:
        cur.execute(f"PRAGMA synchronous = {level}")
    try:
        yield
    finally:
        if db.connection is not None:
            with db.cursor() as cur:
                cur.execute(f"PRAGMA synchronous = {configured}")
