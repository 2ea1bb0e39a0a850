"""complete_step: a step an agent did itself, recorded through a tool call's envelope."""

from __future__ import annotations

import errno

import pytest

from artifacts.models import Artifact
from artifacts.services import ArtifactError, artifact_store
from artifacts.store import default_store
from pippa_site.errors import Invalid, LeaseConflict
from tasks import agent_step, crashpoints
from tasks.actions import (
    ActionError,
    step_complete,
    step_retry,
    task_cancel,
    task_pause,
)
from tasks.agent_step import StepRefused
from tasks.crashpoints import SimulatedCrash
from tasks.executor import step
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tests.support.executing import check_invariants, expire_lease, invocations

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = [
    {"title": "Fetch closes", "tool": "test.fetch", "args": {}},
    {"title": "Search the news", "tool": "test.snapshot", "args": {}},
    {"title": "Chart", "tool": "test.render", "args": {"source": 1}},
]
OUTPUT = b"what the agent made itself"


@pytest.fixture
def task(make_conversation):
    return task_create(conversation=make_conversation(), title="Brief", steps=PLAN)


def steps_of(task) -> list[Step]:
    return list(Step.objects.filter(task=task).order_by("position"))


def complete(task, position: int, data: bytes = OUTPUT, **kwargs):
    kwargs.setdefault("worker_id", "api:dad:claude")
    kwargs.setdefault("media_type", "text/plain")
    the_step = Step.objects.get(task=task, position=position)
    return step_complete(task=task, step_id=the_step.pk, data=data, **kwargs)


def test_an_agents_output_goes_through_the_envelope_as_the_steps_own_class(
    task, tool_log
):
    done = complete(task, 1, title="Closes I read off the broker's page")
    first = Step.objects.select_related("output").get(pk=done.step.pk)
    assert (done.completed, done.already) == (True, False)
    assert first.status == "done"
    assert first.output.artifact_class == 2  # test.fetch's class, not the agent's
    assert first.output.title == "Closes I read off the broker's page"
    assert default_store().get(first.output.sha256) == OUTPUT
    events = list(
        Event.objects.filter(step=first).order_by("seq").values_list("kind", "data")
    )
    assert [kind for kind, _ in events] == [
        "tool_call_started",
        "payload_persisted",
        "tool_result_persisted",
    ]
    assert events[0][1]["by"] == "agent"
    assert events[1][1]["sha"] == first.output.sha256  # the payload is a ref
    task.refresh_from_db()
    assert (task.steps_done, task.status, task.lease_owner) == (1, "queued", "")
    assert invocations(tool_log) == {}  # no tool was called
    check_invariants([task.pk])


def test_the_same_bytes_sent_twice_change_nothing_and_other_bytes_are_refused(task):
    complete(task, 1)
    before = Event.objects.filter(task=task).count()
    again = complete(task, 1, worker_id="api:dad:another")
    assert (again.completed, again.already) == (True, True)
    assert "already done with these very bytes" in again.detail
    assert Event.objects.filter(task=task).count() == before
    with pytest.raises(StepRefused, match="step 1 is done: its output stands"):
        complete(task, 1, b"other bytes")
    assert Event.objects.filter(task=task).count() == before
    assert Artifact.objects.count() == 1


def test_steps_may_be_completed_out_of_order_and_the_worker_runs_the_rest(task):
    chart = complete(task, 3, b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    assert chart.step.position == 3
    outcomes = [step(task_id=task.pk, worker_id="w") for _ in range(3)]
    assert [o.position for o in outcomes if o and o.step_id] == [1, 2]
    task.refresh_from_db()
    assert (task.status, task.steps_done) == ("done", 3)
    check_invariants([task.pk])


def test_a_render_names_the_outputs_it_was_made_from(task, make_user):
    complete(task, 1)
    source = steps_of(task)[0].output
    chart = complete(task, 3, b"<svg/>", source_ids=[source.pk])
    assert list(chart.step.output.source_links.values_list("source_id", flat=True)) == [
        source.pk
    ]
    stranger = artifact_store(
        owner=make_user(),
        data=b"not yours",
        media_type="text/plain",
        artifact_class=2,
    )
    with pytest.raises(ArtifactError):
        complete(task, 2, b"x", source_ids=[stranger.pk])
    assert Step.objects.get(task=task, position=2).status == "pending"


@pytest.mark.parametrize(
    ("stop", "error"),
    [
        (task_pause, "the task is paused: .* \\(resume it first\\)"),
        (task_cancel, "the task is cancelled: a step can be completed only"),
    ],
)
def test_a_task_that_is_not_queued_or_running_takes_no_output(task, stop, error):
    stop(task=task)
    with pytest.raises(ActionError, match=error):
        complete(task, 1)
    assert Step.objects.get(task=task, position=1).status == "pending"
    assert not Event.objects.filter(task=task, kind="tool_call_started").exists()


def test_a_step_another_worker_holds_is_refused_and_keeps_its_lease(task):
    step(task_id=task.pk, worker_id="worker:busy")
    with pytest.raises(LeaseConflict, match="another worker \\(worker:busy\\)"):
        complete(task, 2)
    task.refresh_from_db()
    assert task.lease_owner == "worker:busy"
    assert Step.objects.get(task=task, position=2).status == "pending"


def test_a_failed_step_waits_for_a_person_before_an_agents_output(
    make_conversation,
):
    task = task_create(
        conversation=make_conversation(),
        title="t",
        steps=[
            {
                "title": "Fails",
                "tool": "test.flaky",
                "args": {"fail_times": 5},
                "max_attempts": 1,
            }
        ],
    )
    step(task_id=task.pk, worker_id="w")
    with pytest.raises(ActionError, match="failed: .* waits for a person's decision"):
        complete(task, 1)
    # A person's retry makes it a pending step again: then the output is taken.
    step_retry(step=steps_of(task)[0], actor="dad")
    assert complete(task, 1).completed


def test_a_call_in_flight_under_the_same_lease_is_not_recorded_twice(task):
    # A runner of this same name started the step and holds the lease now.
    crashpoints.arm("after_started", action="raise")
    try:
        with pytest.raises(SimulatedCrash):
            step(task_id=task.pk, worker_id="api:dad:claude")
    finally:
        crashpoints.disarm()
    with pytest.raises(StepRefused, match="being recorded by another call"):
        complete(task, 1)


def test_a_crash_between_the_two_commits_leaves_the_step_to_its_class(task, tool_log):
    crashpoints.arm("after_blob", action="raise")
    try:
        with pytest.raises(SimulatedCrash):
            complete(task, 2)
    finally:
        crashpoints.disarm()
    snapshot = Step.objects.get(task=task, position=2)
    assert snapshot.status == "running"
    assert not Event.objects.filter(
        step=snapshot, kind__in=["payload_persisted", "tool_result_persisted"]
    ).exists()
    complete(task, 1)  # another step goes on meanwhile
    expire_lease(task.pk)
    # No snapshot was saved, so none was shown: class 3 issues its call again.
    outcome = step(task_id=task.pk, worker_id="w")
    assert (outcome.position, outcome.rule) == (2, "class3_issue_again_unshown")
    assert invocations(tool_log)[snapshot.pk] == 1
    check_invariants([task.pk])


def test_a_full_disk_leaves_the_step_open_with_the_reason(task, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(agent_step, "payload_write", full)
    outcome = complete(task, 1)
    assert outcome.completed is False
    assert "could not be saved: disk full" in outcome.detail
    the_step = Step.objects.get(task=task, position=1)
    assert the_step.status == "running"
    assert Event.objects.filter(step=the_step, kind="output_unsaved").exists()


@pytest.mark.parametrize(
    ("data", "media_type", "error"),
    [
        (b"", "text/plain", "the output is empty"),
        (b"x" * (1024 * 1024 + 1), "text/plain", "larger than 1048576 bytes"),
        (b"x", "text", "must be a media type"),
    ],
)
def test_an_output_that_cannot_be_kept_is_refused_before_anything_is_written(
    task, data, media_type, error
):
    with pytest.raises(Invalid, match=error):
        complete(task, 1, data, media_type=media_type)
    assert not Event.objects.filter(task=task, kind="tool_call_started").exists()
    assert Task.objects.get(pk=task.pk).lease_owner == ""
