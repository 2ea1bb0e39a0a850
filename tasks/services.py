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
    return Event.objects.create(
        task_id=task_id,
        step_id=step_id,
        seq=seq,
        kind=kind,
        data=data,
        created_at=timezone.now(),
    )


@transaction.atomic
def events_append(
    *, task_id: int, entries: list[tuple[str, int | None, dict[str, Any] | None]]
) -> list[Event]:
    """Append several events (kind, step_id, data) in order, in one transaction."""
    if not entries:
        return []
    checked = [(kind, step_id, _check_data(data)) for kind, step_id, data in entries]
    last = _next_seqs(task_id, len(checked))
    first = last - len(checked) + 1
    now = timezone.now()
    return Event.objects.bulk_create(
        [
            Event(
                task_id=task_id,
                step_id=step_id,
                seq=first + i,
                kind=kind,
                data=data,
                created_at=now,
            )
            for i, (kind, step_id, data) in enumerate(checked)
        ]
    )
