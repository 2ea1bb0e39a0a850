"""Helpers for executor tests: run a task, read the side channel, check invariants."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from django.db import transaction

from artifacts.store import default_store
from tasks import crashpoints, executor
from tasks.crashpoints import SimulatedCrash
from tasks.executor import step
from tasks.models import Event, Step, Task
from tasks.services import events_append

# Not a boundary of today's executor: the state the executor before the
# two-commit step (three commits) left when killed after its payload commit,
# ``payload_persisted`` committed and no result. A database written by it can
# hold such steps, and resume still settles them by class (adopt).
LEGACY_AFTER_PAYLOAD = "after_payload"


@contextmanager
def three_commit_executor() -> Iterator[None]:
    """Make the executor commit ``payload_persisted`` on its own right after
    the payload file, as the three-commit executor did; arm ``after_blob`` to
    stop it there."""
    real = executor.payload_write

    def persist(row, default_media, output):
        payload = real(row, default_media, output)
        with transaction.atomic():
            events_append(
                task_id=row.task_id,
                entries=[(Event.Kind.PAYLOAD_PERSISTED, row.id, payload)],
            )
        return payload

    executor.payload_write = persist
    try:
        yield
    finally:
        executor.payload_write = real


def boundary_of(point: str):
    """(the crash point to arm, the context to step in) for ``point``, which
    may name ``LEGACY_AFTER_PAYLOAD``."""
    if point.split(":")[0] == LEGACY_AFTER_PAYLOAD:
        return point.replace(
            LEGACY_AFTER_PAYLOAD, "after_blob"
        ), three_commit_executor()
    return point, nullcontext()


def run_task(task_id: int, worker_id: str = "worker:test", limit: int = 100) -> list:
    """Step a task until it stops being runnable by this worker; return the outcomes."""
    outcomes = []
    for _ in range(limit):
        outcome = step(task_id=task_id, worker_id=worker_id)
        if outcome is None:
            break
        outcomes.append(outcome)
        if outcome.task_status != Task.Status.RUNNING:
            break
    return outcomes


def crash_at(task_id: int, boundary: str, worker_id: str = "worker:crashed") -> None:
    """Step until ``boundary`` is reached, leaving the state a SIGKILL there would.

    In-process stand-in for a kill (the subprocess tests use real SIGKILL).
    ``LEGACY_AFTER_PAYLOAD`` leaves what the three-commit executor left there.
    """
    point, context = boundary_of(boundary)
    crashpoints.arm(point, action="raise")
    try:
        with context:
            _step_until_crash(task_id, worker_id, boundary)
    finally:
        crashpoints.disarm()


def _step_until_crash(task_id: int, worker_id: str, boundary: str) -> None:
    for _ in range(100):
        try:
            outcome = step(task_id=task_id, worker_id=worker_id)
        except SimulatedCrash:
            return
        if outcome is None or outcome.task_status != Task.Status.RUNNING:
            break
    raise AssertionError(f"boundary {boundary} was never reached")


def expire_lease(task_id: int) -> None:
    from datetime import timedelta

    from django.utils import timezone

    Task.objects.filter(pk=task_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def invocations(log: Path, tool: str | None = None) -> Counter:
    """Count real tool calls (start lines) per step id from the side-channel file."""
    counts: Counter = Counter()
    if not log.exists():
        return counts
    for line in log.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry["phase"] == "start" and (tool is None or entry["tool"] == tool):
            counts[entry["step"]] += 1
    return counts


def kinds(task_id: int, step_id: int | None = None) -> list[str]:
    events = Event.objects.filter(task_id=task_id)
    if step_id is not None:
        events = events.filter(step_id=step_id)
    return list(events.order_by("seq").values_list("kind", flat=True))


def check_invariants(task_ids: list[int] | None = None) -> None:
    """Assert what must hold after any crash and resume.

    - event sequences are gap-free per task;
    - a done step has an output of its task's owner whose blob is intact and
      whose sha is the one its last ``payload_persisted`` named;
    - steps_done/steps_total agree with the step rows;
    - a step never has two ``tool_call_started`` without a close or a lease
      change (taken / taken over / released) in between;
    - a class-3 step is never started again after its payload was persisted
      (within a generation).
    """
    store = default_store()
    tasks = (
        Task.objects.all() if task_ids is None else Task.objects.filter(pk__in=task_ids)
    ).select_related("conversation")
    for task in tasks:
        events = list(
            Event.objects.filter(task=task)
            .order_by("seq")
            .values_list("seq", "kind", "step_id", "data")
        )
        assert [e[0] for e in events] == list(range(1, len(events) + 1)), task.pk
        assert task.last_seq == len(events)
        steps = list(Step.objects.filter(task=task).select_related("output"))
        finished = sum(s.is_finished for s in steps)
        assert (task.steps_total, task.steps_done) == (len(steps), finished), task.pk
        open_by_step: dict[int, bool] = {}
        persisted_gen: dict[int, set] = {}
        last_payload: dict[int, str] = {}
        for _, kind, step_id, data in events:
            if kind in ("lease_taken", "lease_taken_over", "lease_released"):
                open_by_step = {}
            elif kind == "tool_call_started":
                assert not open_by_step.get(step_id), (
                    f"task {task.pk} step {step_id}: started twice with no close"
                    " or lease change between"
                )
                if data.get("class") == 3:
                    assert data["generation"] not in persisted_gen.get(
                        step_id, set()
                    ), (
                        f"class-3 step {step_id} called again after its snapshot"
                        " was persisted"
                    )
                open_by_step[step_id] = True
            elif kind == "payload_persisted":
                persisted_gen.setdefault(step_id, set()).add(data["generation"])
                last_payload[step_id] = data["sha"]
            elif kind in (
                "tool_result_persisted",
                "tool_call_failed",
                "uncertain_resolved",
                "step_resolved",
                "step_retried",
            ):
                open_by_step[step_id] = False
        owner_id = task.conversation.owner_id
        for s in steps:
            if s.status == "done":
                assert s.output is not None
                assert s.output.owner_id == owner_id, f"step {s.pk}: another's row"
                assert store.verify(s.output.sha256), f"step {s.pk}: blob damaged"
                if s.pk in last_payload and not task.branched_from_id:
                    assert s.output.sha256 == last_payload[s.pk]
