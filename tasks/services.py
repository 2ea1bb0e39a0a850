"""Writes that span tables: conversations, the event log, deletion."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from tasks.models import Conversation, Event, Task

ERR_EVENT_DATA_TOO_LARGE = "event data must stay small (refs and sizes, not payloads)"
ERR_NO_TASK = "no such task"
MAX_EVENT_DATA_CHARS = 4096


class TaskNotFound(LookupError):
    pass


def conversation_create(*, owner, title: str) -> Conversation:
    return Conversation.objects.create(owner=owner, title=title[:300])


def _next_seqs(task_id: int, count: int) -> int:
    """Reserve ``count`` sequence numbers for a task; return the last one.

    One ``UPDATE … RETURNING`` in the caller's transaction: the row lock (PG)
    or the write lock (SQLite, IMMEDIATE) orders concurrent appenders, and a
    rollback returns the numbers with the events, so no gap appears.
    """
    table = connection.ops.quote_name(Task._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_seq = last_seq + %s WHERE id = %s RETURNING last_seq",
            [count, task_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise TaskNotFound(ERR_NO_TASK)
    return row[0]


def _check_data(data: dict[str, Any] | None) -> dict[str, Any]:
    data = data or {}
    if len(json.dumps(data, default=str)) > MAX_EVENT_DATA_CHARS:
        raise ValueError(ERR_EVENT_DATA_TOO_LARGE)
    return data


def _insert_events(
    task_id: int, first_seq: int, rows: list[tuple[str, int | None, dict]]
) -> list[Event]:
    """INSERT the events with one precompiled statement; return unsaved-looking rows.

    The hot path of every step writes several events; building the INSERT by
    hand skips the ORM's per-row SQL compilation (the largest share of its cost
    here) while keeping the same columns, adapters and constraints.
    """
    now = timezone.now()
    created = Event._meta.get_field("created_at").get_db_prep_save(now, connection)
    table = connection.ops.quote_name(Event._meta.db_table)
    json_param = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    values = ", ".join([f"(%s, %s, %s, %s, {json_param}, %s)"] * len(rows))
    params: list = []
    for i, (kind, step_id, data) in enumerate(rows):
        params += [task_id, step_id, first_seq + i, kind, json.dumps(data), created]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (task_id, step_id, seq, kind, data, created_at) "
            f"VALUES {values} RETURNING id",
            params,
        )
        ids = [row[0] for row in cursor.fetchall()]
    events = []
    for pk, (i, (kind, step_id, data)) in zip(
        sorted(ids), enumerate(rows), strict=True
    ):
        event = Event(
            id=pk,
            task_id=task_id,
            step_id=step_id,
            seq=first_seq + i,
            kind=kind,
            data=data,
            created_at=now,
        )
        event._state.adding = False
        event._state.db = connection.alias
        events.append(event)
    return events


@transaction.atomic
def event_append(
    *,
    task_id: int,
    kind: str,
    step_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append one event to a task's log with the next gap-free sequence number."""
    data = _check_data(data)
    seq = _next_seqs(task_id, 1)
    return _insert_events(task_id, seq, [(kind, step_id, data)])[0]


@transaction.atomic
def events_append(
    *, task_id: int, entries: list[tuple[str, int | None, dict[str, Any] | None]]
) -> list[Event]:
    """Append several events (kind, step_id, data) in order, in one transaction."""
    if not entries:
        return []
    checked = [(kind, step_id, _check_data(data)) for kind, step_id, data in entries]
    last = _next_seqs(task_id, len(checked))
    return _insert_events(task_id, last - len(checked) + 1, checked)
