"""Small database helpers below the apps: datetimes as the driver takes
them, the engine, a row by id in one statement, and a column's value from
the driver as the ORM gives it.

The executor's own statements (and the driver-cursor shortcut they run on)
are ``tasks.statements``; transactions are Django's own
``transaction.atomic``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections


@cache
def _sqlite() -> bool:
    return settings.DATABASES[DEFAULT_DB_ALIAS]["ENGINE"].endswith("sqlite3")


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
    with db.cursor() as cursor:
        cursor.execute(sql, [pk])
        row = cursor.fetchone()
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
        column, functions = _converters(db, model, field)
        if functions:
            converters.append((i, functions, column))
    return sql, [f.attname for f in fields], converters


def _converters(db, model, field) -> tuple[Any, list]:
    """The column of ``model``'s ``field`` and the converters the ORM runs
    on its values from the driver (the backend's, then the field's)."""
    column = field.get_col(model._meta.db_table)
    return column, db.ops.get_db_converters(column) + column.get_db_converters(db)


def value_from_db(model, name: str, value: Any) -> Any:
    """``value``, as the driver gave it for ``model``'s field ``name`` (or an
    aggregate of it: ``MIN(started_at)``), as the ORM would give it: an
    aware datetime for SQLite's text, JSON decoded, and so on."""
    db = connections[DEFAULT_DB_ALIAS]
    plans = db.__dict__.setdefault("_pippa_value_plans", {})
    plan = plans.get((model, name))
    if plan is None:
        plan = plans[model, name] = _converters(db, model, model._meta.get_field(name))
    column, functions = plan
    for convert in functions:
        value = convert(value, column, db)
    return value
