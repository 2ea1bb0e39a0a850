"""The executor's and the lease's SQL: one module of named statements.

Every statement the step's hot path runs is a constant here (or, for the
event INSERT and the seq reservation, one builder), next to what it does. No
status is spelled in SQL: each is a parameter bound from the models'
``TextChoices`` (``Step.Status``, ``Task.Status``). ``tests/tasks/
test_statements.py`` pairs each statement with its ORM spelling and checks
that both leave the database the same.

- ``step_row`` is the one builder of the executor's step row (``StepRow``),
  from ``STEP_COLUMNS`` in that order, whether a SELECT, an UPDATE …
  RETURNING or a model instance supplied them.
- ``seqs_reserve`` is the one helper that reserves event sequence numbers
  (``last_seq = last_seq + n``): the lease's renewal, the executor's appends
  and ``tasks.services.events_append`` all go through it.
- ``events_insert`` is the one writer of event rows.

The statements run on Django's own cursor (``connection.cursor()``), as
Django's docs describe for raw SQL: its placeholders (``%s``), its error
wrapping, its query log (``DEBUG``, ``CaptureQueriesContext``), the
``django.db.backends`` logger and ``connection.execute_wrapper()`` hooks see
every one of them. ``transaction.atomic`` opens and commits the transaction.
A datetime parameter is adapted the way Django adapts a ``DateTimeField``'s
value for its backend (``db_datetime``: naive UTC text on SQLite).

``synchronous`` sets SQLite's sync level for one transaction (a connection
may change ``PRAGMA synchronous`` between transactions, never inside one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.utils import timezone

from artifacts.models import Artifact
from tasks.models import LEASE_DEAD, Conversation, Event, Step, Task, TaskArtifact

S = Step.Status
T = Task.Status

T_TASK = Task._meta.db_table
T_CONV = Conversation._meta.db_table
T_STEP = Step._meta.db_table
T_LINK = TaskArtifact._meta.db_table
T_EVENT = Event._meta.db_table
T_ART = Artifact._meta.db_table

ERR_EVENT_DATA_TOO_LARGE = "event data must stay small (refs and sizes, not payloads)"
MAX_EVENT_DATA_CHARS = 4096


def db_datetime(value):
    """``value`` as Django's backend adapts a ``DateTimeField``'s value for its
    driver (naive UTC text on SQLite, the datetime itself on PostgreSQL)."""
    return connection.ops.adapt_datetimefield_value(value)


def cursor():
    """Django's cursor of the default connection (``connection.cursor()``)."""
    return connection.cursor()


def fetch_one(cur, statement: str, params: Any = ()) -> tuple | None:
    """Run ``statement`` on ``cur`` (Django's cursor); return its first row."""
    cur.execute(statement, params)
    return cur.fetchone()


# -- the step row ----------------------------------------------------------------

# The columns of the executor's step row, in ``step_row``'s order; the last is
# the conversation owner's id (the owner of every artifact row a step writes).
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
_OWNER_OF_TASK = (
    f"(SELECT c.owner_id FROM {T_TASK} t JOIN {T_CONV} c "
    f"ON c.id = t.conversation_id WHERE t.id = %s)"
)


@dataclass
class StepRow:
    """What the executor knows of the step it runs (``step_row`` builds it)."""

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
        return f"pippa:{self.task_id}:{self.id}:{self.generation}"

    def as_step(self) -> Step:
        return Step(
            **{name: getattr(self, name) for name in STEP_COLUMNS},
            task_id=self.task_id,
        )


def step_row(task_id: int, values) -> StepRow:
    """The step row from ``STEP_COLUMNS`` then the owner id, as any statement returns them."""
    (
        pk,
        position,
        title,
        status,
        tool,
        args,
        artifact_class,
        side_effects,
        attempts,
        max_attempts,
        generation,
        next_attempt_at,
        owner_id,
    ) = values
    if isinstance(args, (str, bytes, bytearray)):
        args = json.loads(args)
    return StepRow(
        id=pk,
        task_id=task_id,
        position=position,
        title=title,
        status=status,
        tool=tool,
        args=args or {},
        artifact_class=artifact_class,
        side_effects=bool(side_effects),
        attempts=attempts,
        max_attempts=max_attempts,
        generation=generation,
        next_attempt_at=parse_dt(next_attempt_at),
        owner_id=owner_id,
    )


def parse_dt(value):
    """A datetime as read by the driver (text on SQLite) -> an aware datetime."""
    if isinstance(value, str):
        from django.utils.dateparse import parse_datetime

        value = parse_datetime(value)
    if value is not None and value.tzinfo is None:
        from datetime import UTC

        value = value.replace(tzinfo=UTC)
    return value


# -- statements --------------------------------------------------------------------

_STEP_COLS = ", ".join(STEP_COLUMNS)
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

# The lease. A dead lease: nobody holds it, no expiry, or the expiry passed
# (``tasks.models.LEASE_DEAD``; one parameter: now).
LEASE_READ = f"SELECT status, lease_owner, lease_expires_at FROM {T_TASK} WHERE id = %s"
# Take a dead or free lease; the previous holder and the deadness are re-checked.
LEASE_TAKE = (
    f"UPDATE {T_TASK} SET lease_owner = %s, lease_expires_at = %s, status = %s, "
    f"updated_at = %s WHERE id = %s AND lease_owner = %s AND {LEASE_DEAD} "
    f"AND status IN (%s, %s) RETURNING steps_total, steps_done"
)
LEASE_CLEAR = (
    f"UPDATE {T_TASK} SET lease_owner = '', lease_expires_at = NULL WHERE id = %s"
)
# The holder's release at the step boundary of a person's pause or cancel.
LEASE_CLEAR_STOPPED = (
    f"UPDATE {T_TASK} SET lease_owner = '', lease_expires_at = NULL "
    f"WHERE id = %s AND lease_owner = %s AND status IN (%s, %s) RETURNING status"
)
# Give back seqs a renewal reserved and nothing used.
SEQS_GIVE_BACK = f"UPDATE {T_TASK} SET last_seq = last_seq - %s WHERE id = %s"


@lru_cache(maxsize=32)
def _seqs_sql(
    *,
    held: bool,
    renew: bool,
    status_was: bool,
    status_to: bool,
    done: bool,
    close: bool,
) -> str:
    sets = ["last_seq = last_seq + %s"]
    if held:
        sets.append("updated_at = %s")
    if renew:
        sets.append("lease_expires_at = %s")
    if status_to:
        sets.append("status = %s")
    if done:
        sets.append("steps_done = steps_done + 1")
    if close:
        # A person's cancel (or pause, against a mere re-queue) made while the
        # lease was held stands: the worker's bookkeeping does not undo it.
        sets.append("status = CASE WHEN status IN (%s, %s) THEN status ELSE %s END")
        sets.append("finished_at = CASE WHEN status = %s THEN finished_at ELSE %s END")
    where = "id = %s"
    if held:
        where += " AND lease_owner = %s"
    if status_was:
        where += " AND status = %s"
    return (
        f"UPDATE {T_TASK} SET {', '.join(sets)} WHERE {where} "
        f"RETURNING last_seq, steps_done, steps_total"
    )


def seqs_reserve(
    cur,
    task_id: int,
    count: int,
    *,
    holder: str | None = None,
    renew: bool = False,
    status_was: str | None = None,
    status_to: str | None = None,
    step_done: bool = False,
    close: tuple[str, Any, tuple[str, str]] | None = None,
) -> tuple | None:
    """Reserve ``count`` event seqs on the task row; return (last_seq,
    steps_done, steps_total), or None when no row matched.

    The one writer of ``last_seq``. One ``UPDATE … RETURNING`` in the
    caller's transaction: the row lock (PostgreSQL) or the write lock
    (SQLite, IMMEDIATE) orders appenders, and a rollback returns the numbers
    with the events, so no gap appears. With ``holder`` it matches only while
    that worker holds the lease (and stamps ``updated_at``), ``renew`` moves
    the lease's expiry, ``status_was``/``status_to`` check and set the status
    in the same statement, ``step_done`` counts a finished step, ``close`` is
    the holder's release: (status, finished_at, the statuses a person set
    that stand).
    """
    now = timezone.now()
    params: list[Any] = [count]
    if holder is not None:
        params.append(db_datetime(now))
    if renew:
        params.append(
            db_datetime(now + timedelta(seconds=settings.PIPPA_LEASE_SECONDS))
        )
    if status_to:
        params.append(status_to)
    if close:
        status, finished, kept = close
        params += [*kept, status, T.CANCELLED, db_datetime(finished)]
    params.append(task_id)
    if holder is not None:
        params.append(holder)
    if status_was:
        params.append(status_was)
    sql = _seqs_sql(
        held=holder is not None,
        renew=renew,
        status_was=bool(status_was),
        status_to=bool(status_to),
        done=step_done,
        close=bool(close),
    )
    return fetch_one(cur, sql, params)


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
    """INSERT events numbered from ``first_seq`` (reserved by ``seqs_reserve``)
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


def relaxable() -> bool:
    """Whether the transaction running now commits for itself at the level
    ``synchronous`` set (SQLite, no outer transaction): the executor then
    starts a step with outside effects again at FULL."""
    db = connections[DEFAULT_DB_ALIAS]
    return db.vendor == "sqlite" and len(db.atomic_blocks) <= 1


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
