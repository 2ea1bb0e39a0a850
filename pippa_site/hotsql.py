"""Statements of the executor's hot path, on the database driver's own cursor.

Django's cursor wrapper costs about 30 µs a statement on this stack
(placeholder rewriting, the wrapper chain, the thread-local connection proxy)
against a statement of about 25 µs; a step runs a dozen. ``hot_cursor()``
hands out the driver's cursor of the *same* connection, so everything else is
Django's as before:

- the transaction: ``transaction.atomic()`` opens and commits it (SQLite's
  ``BEGIN IMMEDIATE``, PostgreSQL's), and a statement here is part of it;
- the errors: the driver's exceptions become Django's (``DatabaseError``,
  ``IntegrityError``…) through the connection's own error wrapper, so the
  executor's fault handling sees what it always saw;
- the log: when Django logs queries (``DEBUG``, ``CaptureQueriesContext``)
  every statement is logged the same way, so tests count them.

Only plain SQL with ``%s`` placeholders goes through here (the form Django's
raw cursors take); SQLite gets them as ``?``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any

from django.conf import settings
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    Error,
    connections,
    transaction,
)

_PLACEHOLDER = re.compile(r"%%|%s")


@lru_cache(maxsize=1024)
def _qmark(sql: str) -> str:
    """``%s`` -> ``?`` and ``%%`` -> ``%``, as Django's SQLite cursor does."""
    return _PLACEHOLDER.sub(lambda m: "%" if m.group() == "%%" else "?", sql)


def _same(sql: str) -> str:
    return sql


class HotCursor:
    """The driver cursor of the current connection, with Django's error mapping."""

    __slots__ = ("db", "cursor", "_sql")

    def __init__(self, db) -> None:
        if db.connection is None:
            db.ensure_connection()
        self.db = db
        self.cursor = db.connection.cursor()
        self._sql = _qmark if db.vendor == "sqlite" else _same

    def execute(self, sql: str, params: Any = ()) -> HotCursor:
        db = self.db
        native = self._sql(sql)
        if db.force_debug_cursor or _debug():
            return self._logged(sql, native, params)
        with db.wrap_database_errors:
            self.cursor.execute(native, params)
        return self

    def _logged(self, sql: str, native: str, params: Any) -> HotCursor:
        db = self.db
        started = time.monotonic()
        try:
            with db.wrap_database_errors:
                self.cursor.execute(native, params)
        finally:
            db.queries_log.append(
                {
                    "sql": db.ops.last_executed_query(self.cursor, sql, params),
                    "time": f"{time.monotonic() - started:.3f}",
                }
            )
        return self

    def fetchone(self):
        with self.db.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self):
        with self.db.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount

    def __enter__(self) -> HotCursor:
        return self

    def __exit__(self, *exc) -> None:
        """Kept open for the next statement group (``hot_cursor``)."""


def _debug() -> bool:
    # settings.DEBUG, read the way LazySettings keeps it (one dict lookup).
    return (
        settings.__dict__.get("DEBUG", settings.DEBUG) if settings.configured else False
    )


@cache
def _sqlite() -> bool:
    return settings.DATABASES[DEFAULT_DB_ALIAS]["ENGINE"].endswith("sqlite3")


@contextmanager
def joined_atomic() -> Iterator[None]:
    """``transaction.atomic(savepoint=False)`` for a hot path: join the
    caller's transaction when there is one (a failure inside still marks it
    for rollback, as Django's does), else open one. Joining skips Django's
    per-block bookkeeping, which cost more than a statement here."""
    db = connections[DEFAULT_DB_ALIAS]
    if not db.in_atomic_block:
        with transaction.atomic():
            yield
        return
    try:
        yield
    except BaseException:
        db.needs_rollback = True
        raise


def db_is_postgresql() -> bool:
    """``connection.vendor == "postgresql"`` without the per-thread lookup."""
    return not _sqlite()


def db_datetime(value: datetime | None):
    """An aware datetime as the driver takes it: what Django's own adapter
    gives (naive UTC text on SQLite, the datetime itself on PostgreSQL), at a
    fraction of its cost."""
    if value is None or not _sqlite():
        return value
    if value.tzinfo is UTC:
        value = value.replace(tzinfo=None)
    elif value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return str(value)


def utc_now() -> datetime:
    """``timezone.now()`` as this project runs it (USE_TZ is always on)."""
    return datetime.now(UTC)


def hot_cursor() -> HotCursor:
    """The ``HotCursor`` of the default connection (use it as a context manager).

    One per connection, kept on it and reused (a step asks for it eight
    times): a new driver connection (reconnected) gets a new one.
    """
    db = connections[DEFAULT_DB_ALIAS]
    kept = db.__dict__.get("_pippa_hot")
    if kept is not None and db.connection is not None and kept[0] is db.connection:
        return kept[1]
    hot = HotCursor(db)
    db._pippa_hot = (db.connection, hot)
    return hot


class hot_atomic:  # noqa: N801 - used like transaction.atomic
    """``transaction.atomic()`` for the executor's own commits, at less cost.

    On SQLite, for an outermost block in autocommit mode (a worker's step), it
    does what Django's ``Atomic`` does there, without its general bookkeeping:
    ``BEGIN IMMEDIATE`` (the settings' transaction mode) on the driver, the
    connection marked as inside a block (so ``transaction.atomic()`` inside
    makes savepoints, ``on_commit`` queues, ``set_rollback`` works), then
    ``COMMIT``, or ``ROLLBACK`` on an exception or a rollback mark; a failed
    commit is rolled back and raised, a failed rollback drops the connection,
    and the on-commit hooks run after the commit only. Anywhere else (nested,
    PostgreSQL, autocommit off) it is ``transaction.atomic()`` itself.
    """

    __slots__ = ("db", "django", "committed")

    def __enter__(self) -> None:
        db = connections[DEFAULT_DB_ALIAS]
        if db.in_atomic_block or not _sqlite() or not db.get_autocommit():
            self.django = transaction.atomic()
            self.django.__enter__()
            return
        self.django = None
        self.db = db
        self.committed = False
        with db.wrap_database_errors:
            db.connection.execute(f"BEGIN {db.transaction_mode or ''}")
        db.commit_on_exit = True
        db.needs_rollback = False
        db.autocommit = False
        db.in_atomic_block = True

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if self.django is not None:
            return self.django.__exit__(exc_type, exc_value, traceback)
        db = self.db
        db.in_atomic_block = False
        try:
            if db.closed_in_transaction:
                pass  # the database rolled back by itself
            elif exc_type is None and not db.needs_rollback:
                try:
                    with db.wrap_database_errors:
                        db.connection.execute("COMMIT")
                    self.committed = True
                except DatabaseError:
                    self._rollback()
                    raise
            else:
                db.needs_rollback = False
                self._rollback()
        finally:
            if db.closed_in_transaction or db.connection is None:
                db.connection = None
                db.run_on_commit = []
            else:
                db.autocommit = True
                if self.committed:
                    db.run_and_clear_commit_hooks()
                else:
                    db.run_on_commit = []
        return None

    def _rollback(self) -> None:
        db = self.db
        try:
            with db.wrap_database_errors:
                db.connection.execute("ROLLBACK")
        except Error:
            db.close()  # something is wrong with the connection: drop it


_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1


def row_get(model, pk: Any):
    """``model`` row ``pk`` as an instance, or None: one statement, no query building.

    Every request that names a row by its id (a session's user, a preview's
    artifact) starts with this read; the ORM's ``get()`` and even a
    ``RawQuerySet`` cost several times the statement itself. The columns are
    the model's concrete fields in order and go through the same converters
    the ORM applies (dates on SQLite, JSON, booleans), so the instance is the
    one ``Model.objects.get(pk=pk)`` would give.
    """
    if isinstance(pk, int) and not _BIGINT_MIN <= pk <= _BIGINT_MAX:
        return None  # no row has it (and the drivers refuse to send it)
    db = connections[DEFAULT_DB_ALIAS]
    plans = db.__dict__.setdefault("_pippa_row_plans", {})
    plan = plans.get(model)
    if plan is None:
        plan = plans[model] = _row_plan(db, model)
    sql, names, converters = plan
    with hot_cursor() as cursor:
        row = cursor.execute(sql, [pk]).fetchone()
    if row is None:
        return None
    if converters:
        row = list(row)
        for i, functions, column in converters:
            value = row[i]
            for convert in functions:
                value = convert(value, column, db)
            row[i] = value
    return model.from_db(DEFAULT_DB_ALIAS, names, row)


def _row_plan(db, model) -> tuple[str, list[str], list]:
    meta = model._meta
    quote = db.ops.quote_name
    fields = meta.concrete_fields
    sql = (
        f"SELECT {', '.join(quote(f.column) for f in fields)} "
        f"FROM {quote(meta.db_table)} WHERE {quote(meta.pk.column)} = %s"
    )
    converters = []
    for i, field in enumerate(fields):
        column = field.get_col(meta.db_table)
        functions = db.ops.get_db_converters(column) + column.get_db_converters(db)
        if functions:
            converters.append((i, functions, column))
    return sql, [f.attname for f in fields], converters
