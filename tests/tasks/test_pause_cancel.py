"""Pause, cancel and decide: a person's actions on a task, through the executor's services.

A pause or cancel takes effect at the next step boundary: a call in flight
finishes and its result is saved, then no further step starts and the worker
gives its lease back. A decision on a step that needs a person is also the
go-ahead: the task goes back to the worker by itself.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from pippa_site.errors import Conflict
from tasks.actions import (
    ERR_BRANCH_NOTHING,
    ERR_NOT_CANCELLABLE,
    ERR_TASK_CANCELLED,
    step_resolve,
    step_retry,
    task_branch,
    task_cancel,
    task_pause,
    task_resume,
)
from tasks.executor import step
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tasks.tools import ToolContext, ToolResult, tool
from tests.support.executing import crash_at, expire_lease, kinds
from tests.support.stepping import run_steps

pytestmark = pytest.mark.django_db

WORKER = "worker:test-ops"


def _stop_midway(ctx: ToolContext, *, how: str = "pause") -> ToolResult:
    """Dad presses pause or cancel while this call is in flight."""
    task = Task.objects.get(pk=ctx.task_id)
    if how == "cancel":
        task_cancel(task=task, actor="user:dad")
    else:
        task_pause(task=task, actor="user:dad")
    return ToolResult(data=f"finished anyway ({how})".encode())


tool("test.stop_midway", artifact_class=2, media_type="text/plain")(_stop_midway)


@pytest.fixture(autouse=True)
def _retry_at_once(settings):
    # Failed attempts retry at once here: these tests are about pause and cancel.
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    settings.PIPPA_RETRY_MAX_SECONDS = 0


def _task(conversation, steps: list[dict], **kwargs) -> Task:
    return task_create(conversation=conversation, title="Ops", steps=steps, **kwargs)


def _run(task: Task, times: int = 10) -> Task:
    return run_steps(task, WORKER, times)


def _kinds(task: Task) -> list[str]:
    return kinds(task.pk)


# -- pause -------------------------------------------------------------------


def test_a_pause_during_a_call_saves_that_call_and_starts_no_further_step(
    make_conversation,
):
    task = _task(
        make_conversation(),
        [
            {"title": "one", "tool": "test.stop_midway", "args": {"how": "pause"}},
            {"title": "two", "tool": "test.fetch"},
        ],
    )
    outcome = step(task_id=task.pk, worker_id=WORKER)
    assert outcome.status == Step.Status.DONE
    assert step(task_id=task.pk, worker_id=WORKER) is None
    task.refresh_from_db()
    first, second = task.steps.order_by("position")
    assert first.status == Step.Status.DONE
    assert first.output_id is not None
    assert second.status == Step.Status.PENDING
    assert second.attempts == 0
    assert task.status == Task.Status.PAUSED
    assert task.lease_owner == ""
    released = Event.objects.filter(task=task, kind=Event.Kind.LEASE_RELEASED).last()
    assert released.data == {"worker": WORKER, "reason": "paused"}


def test_a_paused_task_finishes_after_resume(make_conversation):
    task = _task(
        make_conversation(),
        [
            {"title": "one", "tool": "test.stop_midway", "args": {"how": "pause"}},
            {"title": "two", "tool": "test.fetch"},
        ],
    )
    _run(task)
    task_resume(task=task, actor="user:dad")
    assert _run(task).status == Task.Status.DONE


def test_a_finished_task_cannot_be_paused(make_conversation):
    task = _run(_task(make_conversation(), [{"title": "one", "tool": "test.fetch"}]))
    with pytest.raises(Conflict):
        task_pause(task=task, actor="user:dad")


# -- cancel ------------------------------------------------------------------


def test_a_cancel_during_a_call_saves_that_call_and_the_task_stays_cancelled(
    make_conversation,
):
    task = _task(
        make_conversation(),
        [
            {"title": "one", "tool": "test.fetch"},
            {"title": "two", "tool": "test.stop_midway", "args": {"how": "cancel"}},
        ],
    )
    _run(task)
    steps = list(task.steps.order_by("position"))
    assert [s.status for s in steps] == [Step.Status.DONE, Step.Status.DONE]
    assert task.status == Task.Status.CANCELLED
    assert task.finished_at is not None
    assert task.lease_owner == ""
    cancelled = Event.objects.get(task=task, kind=Event.Kind.TASK_CANCELLED)
    assert cancelled.data["actor"] == "user:dad"
    assert cancelled.data["in_flight"] is True


def test_a_cancelled_task_is_not_picked_up_again(make_conversation):
    task = _task(
        make_conversation(),
        [
            {"title": "one", "tool": "test.fetch"},
            {"title": "two", "tool": "test.fetch"},
        ],
    )
    task_cancel(task=task, actor="user:dad")
    assert step(task_id=task.pk, worker_id=WORKER) is None
    assert not Task.objects.runnable().filter(pk=task.pk).exists()
    assert task.steps.filter(attempts__gt=0).count() == 0


def test_cancelling_a_task_with_a_dead_worker_releases_its_stale_lease(
    make_conversation,
):
    task = _task(make_conversation(), [{"title": "one", "tool": "test.fetch"}])
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner="worker:gone",
        lease_expires_at=timezone.now() - timezone.timedelta(minutes=5),
    )
    task_cancel(task=task, actor="user:dad")
    assert task.lease_owner == ""
    assert Event.objects.filter(task=task, kind=Event.Kind.LEASE_RELEASED).exists()


@pytest.mark.parametrize("status", [Task.Status.DONE, Task.Status.CANCELLED])
def test_a_finished_or_cancelled_task_cannot_be_cancelled(make_task, status):
    task = make_task(status=status)
    with pytest.raises(Conflict) as exc:
        task_cancel(task=task, actor="user:dad")
    assert str(exc.value) == ERR_NOT_CANCELLABLE.format(
        status=Task.Status(status).label
    )
    assert not Event.objects.filter(task=task).exists()


def test_a_cancelled_task_refuses_resume_retry_and_resolve_but_can_be_branched(
    make_conversation,
):
    task = _task(
        make_conversation(),
        [
            {"title": "one", "tool": "test.fetch"},
            {"title": "two", "tool": "test.flaky", "args": {"fail_times": 5}},
        ],
    )
    Step.objects.filter(task=task, position=2).update(max_attempts=1)
    _run(task)
    assert task.status == Task.Status.FAILED
    task_cancel(task=task, actor="user:dad")
    failed = task.steps.get(position=2)
    for action in (
        lambda: task_resume(task=task),
        lambda: step_retry(step=failed),
        lambda: step_resolve(step=failed, action="skip"),
    ):
        with pytest.raises(Conflict) as exc:
            action()
        assert str(exc.value) == ERR_TASK_CANCELLED
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED
    branch = task_branch(task=task, after_position=1, actor="user:dad")
    assert branch.status == Task.Status.QUEUED


def test_the_doctor_does_not_reopen_a_cancelled_task(make_conversation):
    from tasks.doctor import _envelope_close

    task = _task(make_conversation(), [{"title": "one", "tool": "test.fetch"}])
    crash_at(task.pk, "after_started", WORKER)
    expire_lease(task.pk)
    task_cancel(task=task, actor="user:dad")
    started = Event.objects.get(task=task, kind=Event.Kind.TOOL_CALL_STARTED)
    _envelope_close(started.pk, task.pk, started.step_id)
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED


# -- one way forward: the decision is the go-ahead ----------------------------


def _interrupted(conversation, tool_name: str, boundary: str) -> Task:
    """A task whose worker died at ``boundary`` in its first step, then paused."""
    task = _task(
        conversation,
        [
            {"title": "call", "tool": tool_name},
            {"title": "after", "tool": "test.fetch"},
        ],
    )
    crash_at(task.pk, boundary, WORKER)
    expire_lease(task.pk)
    task.refresh_from_db()
    task_pause(task=task, actor="demo")
    return task


@pytest.mark.parametrize(
    ("tool_name", "boundary", "action"),
    [
        ("test.snapshot", "after_payload", "adopt"),
        ("test.fetch", "after_started", "rerun"),
        ("test.snapshot", "after_started", "skip"),
    ],
)
def test_a_decision_on_a_paused_task_queues_it_and_the_worker_finishes_it(
    make_conversation, tool_name, boundary, action
):
    task = _interrupted(make_conversation(), tool_name, boundary)
    assert task.status == Task.Status.PAUSED
    first = task.steps.get(position=1)
    step_resolve(step=first, action=action, actor="user:dad")
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    queued = Event.objects.filter(task=task, kind=Event.Kind.TASK_QUEUED).last()
    assert queued.data == {"actor": "user:dad", "reason": "decision"}
    assert _run(task).status == Task.Status.DONE


def test_marking_a_step_failed_leaves_the_task_failed_not_queued(make_conversation):
    task = _interrupted(make_conversation(), "test.effect", "after_started")
    step_resolve(step=task.steps.get(position=1), action="fail", actor="user:dad")
    task.refresh_from_db()
    assert task.status == Task.Status.FAILED
    assert step(task_id=task.pk, worker_id=WORKER) is None
    assert task.steps.get(position=2).attempts == 0


def test_a_retry_on_a_paused_task_queues_it_and_says_who_decided(make_conversation):
    task = _task(
        make_conversation(),
        [{"title": "flaky", "tool": "test.flaky", "args": {"fail_times": 1}}],
    )
    Step.objects.filter(task=task).update(max_attempts=1)
    _run(task)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    step_retry(step=task.steps.get(), actor="user:dad")
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    assert _kinds(task)[-1] == Event.Kind.TASK_QUEUED


# -- branch only where it changes something ----------------------------------


def test_a_branch_after_the_last_step_of_a_finished_task_is_refused(
    make_conversation,
):
    task = _run(
        _task(
            make_conversation(),
            [
                {"title": "one", "tool": "test.fetch"},
                {"title": "two", "tool": "test.fetch"},
            ],
        )
    )
    with pytest.raises(Conflict) as exc:
        task_branch(task=task, after_position=2, actor="user:dad")
    assert str(exc.value) == ERR_BRANCH_NOTHING
    assert Task.objects.count() == 1
    assert task_branch(task=task, after_position=1).steps_done == 1
