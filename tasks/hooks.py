"""What the tasks app tells the apps above it: Django signals it sends.

The tasks app names no app above it (the layers in ``pyproject.toml``). An app
that reacts to a task's life connects its receivers to these signals when it
is ready (the notifications app: ``notifications.outbox.connect``).
Receivers run in the sender's thread and transaction (``Signal.send``): one
that raises rolls the sender's transaction back, so whatever a receiver writes
commits exactly when the transition does, or not at all.
"""

from __future__ import annotations

from django.dispatch import Signal

# A step starts waiting for a person (``needs_review``, or ``failed`` with no
# attempts left). Sent inside the transaction that makes it wait, with
# ``step_id``, ``reason`` (the waiting status) and ``owner_id`` (None: the
# receiver reads it).
step_waiting = Signal()

# A worker starts (``worker_id``). Each receiver returns a list of problems in
# words (no secrets), which the worker logs.
worker_started = Signal()

# A worker's poll round begins (``worker_id``), outside any transaction:
# work that is due after a commit (the notification outbox's delivery).
worker_round = Signal()


def step_waiting_send(*, step_id: int, reason: str, owner_id: int | None = None):
    """Send ``step_waiting`` for one step (inside the caller's transaction)."""
    step_waiting.send(sender=None, step_id=step_id, reason=reason, owner_id=owner_id)


def worker_problems(*, worker_id: str) -> list[str]:
    """What the connected apps find wrong at a worker's start, in words."""
    problems: list[str] = []
    for _receiver, found in worker_started.send(sender=None, worker_id=worker_id):
        problems.extend(found or [])
    return problems
