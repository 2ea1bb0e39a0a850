"""The step executor in one process: envelope, leases, attempts, resume by class, retry, branch."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from artifacts.models import Artifact
from pippa_site.errors import Conflict
from tasks import actions, statements
from tasks.actions import (
    ERR_LEASE_CHANGING,
    step_resolve,
    step_resolve_options,
    step_retry,
    task_branch,
    task_pause,
    task_resume,
)
from tasks.executor import step
from tasks.lease import lease_release
from tasks.models import Event, Step, Task, TaskArtifact
from tasks.plan import task_create
from tasks.resume import envelope_read
from tests.support.blobs import blob_lose
from tests.support.executing import (
    check_invariants,
    crash_at,
    expire_lease,
    invocations,
    kinds,
    run_task,
)
from tests.support.plans import DEMO_PLAN


@pytest.fixture
def demo_task(make_conversation):
    def make(**kwargs):
        kwargs.setdefault("steps", DEMO_PLAN)
        kwargs.setdefault("title", "Chart PIPA")
        return task_create(conversation=make_conversation(), **kwargs)

    return make


def one_step_task(make_conversation, tool: str, **args) -> Task:
    return task_create(
        conversation=make_conversation(),
        title=f"one {tool}",
        steps=[{"title": tool, "tool": tool, "args": args}],
    )


def effect_looked_at_after(make_conversation, boundary: str) -> tuple[Task, Step]:
    """A one-step task with outside effects whose worker died at ``boundary``;
    once its lease expired, another worker stepped it (and left it for a person)."""
    task = one_step_task(make_conversation, "test.effect")
    crash_at(task.pk, boundary)
    expire_lease(task.pk)
    step(task_id=task.pk, worker_id="w")
    return task, Step.objects.get(task=task)


@pytest.mark.django_db
def test_step_runs_the_plan_in_order_and_logs_each_envelope_boundary(demo_task):
    task = demo_task()
    outcomes = run_task(task.pk)
    assert [o.position for o in outcomes] == [1, 2, 3, 4]
    assert all(o.status == "done" and o.invoked for o in outcomes)
    task.refresh_from_db()
    assert (task.status, task.steps_done, task.steps_total) == ("done", 4, 4)
    assert task.lease_owner == ""
    first = Step.objects.get(task=task, position=1)
    assert kinds(task.pk, first.pk) == [
        "tool_call_started",
        "payload_persisted",
        "tool_result_persisted",
    ]
    assert kinds(task.pk)[-2:] == ["task_finished", "lease_released"]
    chart = Step.objects.get(task=task, position=4).output
    closes = Step.objects.get(task=task, position=2).output
    assert list(chart.sources.all()) == [closes]
    # Four outputs, plus the chart's PNG preview rendered at write time.
    assert TaskArtifact.objects.filter(task=task, role="persisted").count() == 5
    check_invariants([task.pk])


@pytest.mark.django_db
def test_the_result_handed_back_is_a_ref_whose_event_was_already_written(demo_task):
    task = demo_task()
    outcome = step(task_id=task.pk, worker_id="w")
    event = Event.objects.get(task=task, kind="tool_result_persisted")
    assert event.data["artifact_id"] == outcome.artifact["id"]
    assert (
        outcome.artifact["sha256"]
        == Artifact.objects.get(pk=event.data["artifact_id"]).sha256
    )


@pytest.mark.django_db
def test_a_second_worker_gets_nothing_while_the_lease_is_live(demo_task):
    task = demo_task()
    step(task_id=task.pk, worker_id="worker:a")
    assert step(task_id=task.pk, worker_id="worker:b") is None
    task.refresh_from_db()
    assert task.lease_owner == "worker:a"
    assert Step.objects.get(task=task, position=2).status == "pending"


@pytest.mark.django_db
def test_an_expired_lease_is_taken_over_and_the_event_names_the_previous_owner(
    demo_task,
):
    task = demo_task()
    step(task_id=task.pk, worker_id="worker:a")
    expire_lease(task.pk)
    outcome = step(task_id=task.pk, worker_id="worker:b")
    assert outcome.position == 2
    takeover = Event.objects.get(task=task, kind="lease_taken_over")
    assert takeover.data["previous_owner"] == "worker:a"
    assert takeover.data["worker"] == "worker:b"


@pytest.mark.django_db
def test_a_worker_that_lost_its_lease_cannot_record_a_result(demo_task):
    from tasks.lease import LeaseLost, lease_append

    task = demo_task()
    step(task_id=task.pk, worker_id="worker:a")
    Task.objects.filter(pk=task.pk).update(lease_owner="worker:b")
    with pytest.raises(LeaseLost), connection.cursor() as cursor:
        lease_append(cursor, task.pk, "worker:a", [("probe", None, {})])
    assert not Event.objects.filter(kind="probe").exists()


@pytest.mark.django_db
def test_a_failing_tool_is_retried_up_to_its_limit_then_the_task_fails(
    make_conversation, settings
):
    settings.PIPPA_RETRY_BASE_SECONDS = 0  # no back-off: see tests/tasks/test_faults.py
    task = task_create(
        conversation=make_conversation(),
        title="flaky",
        steps=[
            {
                "title": "flaky",
                "tool": "test.flaky",
                "args": {"fail_times": 5},
                "max_attempts": 3,
            }
        ],
    )
    outcomes = run_task(task.pk)
    assert [o.status for o in outcomes] == ["pending", "pending", "failed"]
    the_step = Step.objects.get(task=task)
    assert (the_step.status, the_step.attempts) == ("failed", 3)
    assert "flaky failure on attempt 3" in the_step.error
    task.refresh_from_db()
    assert task.status == "failed"
    assert kinds(task.pk, the_step.pk).count("tool_call_failed") == 3


@pytest.mark.django_db
def test_a_tool_that_recovers_within_its_attempts_finishes_the_step(
    make_conversation, settings
):
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    task = one_step_task(make_conversation, "test.flaky", fail_times=1)
    outcomes = run_task(task.pk)
    assert [o.status for o in outcomes] == ["pending", "done"]
    task.refresh_from_db()
    assert task.status == "done"


@pytest.mark.django_db
def test_the_idempotency_key_survives_an_uncertain_resume_and_only_retry_bumps_it(
    make_conversation, tool_log
):
    import json

    task = one_step_task(make_conversation, "test.fetch")
    crash_at(task.pk, "after_tool")
    expire_lease(task.pk)
    outcome = step(task_id=task.pk, worker_id="worker:b")
    assert outcome.rule == "class2_fetch_again"
    keys = [json.loads(line)["key"] for line in tool_log.read_text().splitlines()]
    the_step = Step.objects.get(task=task)
    assert set(keys) == {f"pippa:{task.pk}:{the_step.pk}:0"}
    started = Event.objects.filter(task=task, kind="tool_call_started")
    assert [e.data["key"] for e in started] == [keys[0], keys[0]]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("boundary", "rule", "calls"),
    [
        ("before_started_commit", "", 1),
        ("after_started", "class3_issue_again_unshown", 1),
        ("after_tool", "class3_issue_again_unshown", 2),
        ("after_payload", "class3_adopt_snapshot", 1),
        ("after_result", "", 1),
    ],
)
def test_class3_snapshot_is_never_taken_again_once_persisted(
    make_conversation, tool_log, boundary, rule, calls
):
    task = task_create(
        conversation=make_conversation(),
        title="search",
        steps=[
            {"title": "search", "tool": "test.snapshot", "args": {}},
            {"title": "next", "tool": "test.fetch", "args": {}},
        ],
    )
    crash_at(task.pk, boundary)
    expire_lease(task.pk)
    outcomes = run_task(task.pk, worker_id="worker:b")
    search = Step.objects.get(task=task, position=1)
    assert outcomes[0].rule == rule
    assert invocations(tool_log, "test.snapshot")[search.pk] == calls
    assert search.status == "done"
    if rule:
        resolved = Event.objects.get(step=search, kind="uncertain_resolved")
        assert resolved.data["rule"] == rule
    check_invariants([task.pk])


@pytest.mark.django_db
def test_class1_reuses_an_intact_file_and_makes_it_again_when_it_changed(
    make_conversation, tool_log
):
    from tasks.resume import class1_file

    task = one_step_task(make_conversation, "test.file")
    crash_at(task.pk, "after_payload")
    expire_lease(task.pk)
    outcome = step(task_id=task.pk, worker_id="worker:b")
    the_step = Step.objects.get(task=task)
    assert outcome.rule == "class1_reuse_file"
    assert invocations(tool_log)[the_step.pk] == 1

    other = one_step_task(make_conversation, "test.file")
    crash_at(other.pk, "after_payload")
    payload = Event.objects.get(task=other, kind="payload_persisted").data
    path = class1_file(payload)
    path.chmod(0o600)  # read-only as it is written: its owner opens it up first
    path.write_bytes(b"someone edited the file")
    expire_lease(other.pk)
    outcome = step(task_id=other.pk, worker_id="worker:b")
    other_step = Step.objects.get(task=other)
    assert outcome.rule == "class1_regenerate_missing"
    assert invocations(tool_log)[other_step.pk] == 2
    assert other_step.status == "done"


@pytest.mark.django_db
def test_class4_renders_again_only_while_its_sources_are_alive(
    make_conversation, tool_log, blob_store
):
    plan = [
        {"title": "data", "tool": "test.fetch", "args": {}},
        {"title": "render", "tool": "test.render", "args": {"source": 1}},
    ]
    live = task_create(conversation=make_conversation(), title="live", steps=plan)
    crash_at(live.pk, "after_tool:2")
    expire_lease(live.pk)
    assert step(task_id=live.pk, worker_id="w").rule == "class4_rerender"
    render = Step.objects.get(task=live, position=2)
    assert invocations(tool_log, "test.render")[render.pk] == 2

    dead = task_create(conversation=make_conversation(), title="dead", steps=plan)
    crash_at(dead.pk, "after_tool:2")
    source = Step.objects.get(task=dead, position=1).output
    blob_lose(source.sha256, blob_store)
    expire_lease(dead.pk)
    outcome = step(task_id=dead.pk, worker_id="w")
    render = Step.objects.get(task=dead, position=2)
    assert outcome.rule == "class4_sources_gone"
    assert render.status == "needs_review"
    assert "source" in render.error
    assert invocations(tool_log, "test.render")[render.pk] == 1
    dead.refresh_from_db()
    assert (dead.status, dead.lease_owner) == ("needs_review", "")
    assert "rerun" not in step_resolve_options(render)


@pytest.mark.django_db
def test_class4_reuses_an_intact_persisted_render(make_conversation, tool_log):
    plan = [
        {"title": "data", "tool": "test.fetch", "args": {}},
        {"title": "render", "tool": "test.render", "args": {"source": 1}},
    ]
    task = task_create(conversation=make_conversation(), title="t", steps=plan)
    crash_at(task.pk, "after_payload:2")
    expire_lease(task.pk)
    assert step(task_id=task.pk, worker_id="w").rule == "class4_reuse_render"
    render = Step.objects.get(task=task, position=2)
    assert invocations(tool_log, "test.render")[render.pk] == 1


@pytest.mark.django_db
def test_an_uncertain_side_effect_step_waits_for_a_person(make_conversation, tool_log):
    task = one_step_task(make_conversation, "test.effect")
    crash_at(task.pk, "after_payload")
    expire_lease(task.pk)
    outcome = step(task_id=task.pk, worker_id="w")
    the_step = Step.objects.get(task=task)
    assert outcome.rule == "side_effects_review"
    assert the_step.status == "needs_review"
    assert invocations(tool_log)[the_step.pk] == 1
    assert step_resolve_options(the_step) == ["adopt", "rerun", "fail", "skip"]
    # A worker does not touch it again.
    assert step(task_id=task.pk, worker_id="w") is None

    step_resolve(step=the_step, action="adopt", actor="staff:dad")
    the_step.refresh_from_db()
    task.refresh_from_db()
    assert the_step.status == "done"
    assert the_step.output_id
    assert (task.status, task.steps_done) == ("done", 1)
    assert invocations(tool_log)[the_step.pk] == 1
    resolved = Event.objects.get(step=the_step, kind="step_resolved")
    assert resolved.data["actor"] == "staff:dad"
    check_invariants([task.pk])


@pytest.mark.django_db
def test_step_resolve_refuses_an_action_the_class_rules_do_not_allow(
    make_conversation,
):
    _, the_step = effect_looked_at_after(make_conversation, "after_started")
    assert step_resolve_options(the_step) == ["rerun", "fail", "skip"]
    with pytest.raises(Conflict, match="'adopt' is not allowed"):
        step_resolve(step=the_step, action="adopt")
    with pytest.raises(Conflict, match="unknown action"):
        step_resolve(step=the_step, action="explode")
    the_step.refresh_from_db()
    assert the_step.status == "needs_review"


@pytest.mark.django_db
def test_rerun_sends_the_same_idempotency_key_again(make_conversation, tool_log):
    import json

    task, the_step = effect_looked_at_after(make_conversation, "after_tool")
    step_resolve(step=the_step, action="rerun", actor="staff:dad")
    task.refresh_from_db()
    assert task.status == "queued"
    run_task(task.pk)
    keys = {json.loads(line)["key"] for line in tool_log.read_text().splitlines()}
    assert keys == {f"pippa:{task.pk}:{the_step.pk}:0"}
    the_step.refresh_from_db()
    assert the_step.status == "done"


@pytest.mark.django_db
def test_skip_and_fail_settle_the_task(make_conversation):
    task = task_create(
        conversation=make_conversation(),
        title="two",
        steps=[
            {"title": "effect", "tool": "test.effect", "args": {}},
            {"title": "fetch", "tool": "test.fetch", "args": {}},
        ],
    )
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    step(task_id=task.pk, worker_id="w")
    step_resolve(step=Step.objects.get(task=task, position=1), action="skip")
    task.refresh_from_db()
    assert (task.status, task.steps_done) == ("queued", 1)
    run_task(task.pk)
    task.refresh_from_db()
    assert (task.status, task.steps_done) == ("done", 2)
    check_invariants([task.pk])


@pytest.mark.django_db
def test_retry_of_a_class3_step_takes_a_new_snapshot_and_keeps_the_old_one(
    make_conversation,
):
    # An effect step in needs_review, retried: a new generation and key.
    task, the_step = effect_looked_at_after(make_conversation, "after_payload")
    step_retry(step=the_step, actor="staff:dad")
    the_step.refresh_from_db()
    assert (the_step.status, the_step.generation, the_step.attempts) == (
        "pending",
        1,
        0,
    )
    run_task(task.pk)
    the_step.refresh_from_db()
    assert the_step.status == "done"
    started = Event.objects.filter(step=the_step, kind="tool_call_started")
    assert [e.data["key"][-2:] for e in started] == [":0", ":1"]

    search = task_create(
        conversation=make_conversation(),
        title="search",
        steps=[
            {
                "title": "search",
                "tool": "demo.search",
                "args": {"query": "PIPA", "fail_until_generation": 1},
                "max_attempts": 1,
            }
        ],
    )
    run_task(search.pk)
    s = Step.objects.get(task=search)
    assert s.status == "failed"
    step_retry(step=s, actor="staff:dad")
    run_task(search.pk)
    s.refresh_from_db()
    first_snapshot = s.output
    assert s.status == "done"
    assert s.generation == 1
    # A later retry (after review) makes a new snapshot; the old stays linked.
    Step.objects.filter(pk=s.pk).update(status="needs_review")
    Task.objects.filter(pk=search.pk).update(status="needs_review", steps_done=0)
    step_retry(step=s)
    run_task(search.pk)
    s.refresh_from_db()
    assert s.status == "done"
    assert s.generation == 2
    assert s.output_id != first_snapshot.pk
    linked = set(
        TaskArtifact.objects.filter(task=search).values_list("artifact_id", flat=True)
    )
    assert {first_snapshot.pk, s.output_id} <= linked
    assert Event.objects.filter(step=s, kind="step_retried").count() == 2


@pytest.mark.django_db
def test_retry_refuses_a_step_that_is_not_failed_or_in_review(demo_task):
    task = demo_task()
    step(task_id=task.pk, worker_id="w")
    done = Step.objects.get(task=task, position=1)
    with pytest.raises(Conflict, match="only a failed or needs-review step"):
        step_retry(step=done)


@pytest.mark.django_db
def test_branch_keeps_the_first_steps_with_their_outputs_and_continues(
    demo_task, tool_log
):
    task = demo_task()
    run_task(task.pk)
    branch = task_branch(task=task, after_position=2, actor="staff:dad")
    assert branch.conversation_id == task.conversation_id
    assert (branch.branched_from_id, branch.branched_at) == (task.pk, 2)
    assert (branch.status, branch.steps_done, branch.steps_total) == ("queued", 2, 4)
    old = {s.position: s for s in Step.objects.filter(task=task)}
    new = {s.position: s for s in Step.objects.filter(task=branch)}
    assert new[1].output_id == old[1].output_id
    assert new[2].output_id == old[2].output_id
    assert new[3].status == "pending"
    assert new[3].output_id is None
    assert TaskArtifact.objects.filter(task=branch, role="referenced").count() == 2
    before = sum(invocations(tool_log).values())
    run_task(branch.pk)
    branch.refresh_from_db()
    assert branch.status == "done"
    assert sum(invocations(tool_log).values()) == before + 2
    assert Event.objects.filter(task=task, kind="task_branched").exists()


@pytest.mark.django_db
def test_branch_refuses_to_keep_an_unfinished_step(demo_task):
    task = demo_task()
    step(task_id=task.pk, worker_id="w")
    with pytest.raises(Conflict, match="step 2 is pending"):
        task_branch(task=task, after_position=2)
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_pause_takes_a_task_off_the_queue_and_resume_puts_it_back(demo_task):
    task = demo_task()
    task_pause(task=task, actor="staff:dad")
    assert step(task_id=task.pk, worker_id="w") is None
    assert not Task.objects.runnable().filter(pk=task.pk).exists()
    task_resume(task=task, actor="staff:dad")
    assert task.status == "queued"
    assert Event.objects.filter(task=task, kind="task_queued").last().data == {
        "actor": "staff:dad",
        "reason": "resume",
    }
    assert step(task_id=task.pk, worker_id="w").position == 1


@pytest.mark.django_db
def test_resume_refuses_a_task_with_a_step_that_needs_a_person(make_conversation):
    task = one_step_task(make_conversation, "test.effect")
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    step(task_id=task.pk, worker_id="w")
    with pytest.raises(Conflict, match="step 1 is needs review"):
        task_resume(task=task)


@pytest.mark.django_db
def test_lease_release_refuses_a_live_lease_unless_forced(demo_task):
    task = demo_task()
    step(task_id=task.pk, worker_id="worker:a")
    with pytest.raises(Conflict, match="holds this task's lease"):
        lease_release(task=task, actor="staff:dad")
    assert lease_release(task=task, actor="worker:a") is True
    step(task_id=task.pk, worker_id="worker:a")
    assert lease_release(task=task, actor="staff:dad", force=True) is True
    task.refresh_from_db()
    assert (task.lease_owner, task.status) == ("", "queued")
    released = Event.objects.filter(task=task, kind="lease_released").last()
    assert released.data["forced"] is True
    assert lease_release(task=task) is False


@pytest.mark.django_db
def test_listing_a_conversations_tasks_with_progress_reads_no_step_or_event_rows(
    demo_task, make_conversation
):
    conversation = make_conversation()
    tasks = [
        task_create(conversation=conversation, title=f"t{i}", steps=DEMO_PLAN)
        for i in range(3)
    ]
    run_task(tasks[0].pk)
    step(task_id=tasks[1].pk, worker_id="w")
    with CaptureQueriesContext(connection) as captured:
        listing = [
            (t.title, t.status, t.steps_done, t.steps_total, t.progress_percent)
            for t in conversation.tasks.order_by("created_at")
        ]
    assert listing == [
        ("t0", "done", 4, 4, 100),
        ("t1", "running", 1, 4, 25),
        ("t2", "queued", 0, 4, 0),
    ]
    sql = " ".join(q["sql"] for q in captured.captured_queries)
    assert "tasks_step" not in sql
    assert "tasks_event" not in sql
    # The denormalised counts agree with the rows they stand for.
    for t in tasks:
        t.refresh_from_db()
        assert t.steps_done == Step.objects.filter(task=t, status="done").count()


@pytest.mark.django_db
def test_a_task_paused_and_resumed_while_its_worker_holds_the_lease_carries_on(
    demo_task,
):
    task = demo_task()
    step(task_id=task.pk, worker_id="worker:a")
    task_pause(task=task, actor="staff:dad")
    task_resume(task=task, actor="staff:dad")
    outcome = step(task_id=task.pk, worker_id="worker:a")
    assert outcome.position == 2
    task.refresh_from_db()
    assert (task.status, task.lease_owner) == ("running", "worker:a")


@pytest.mark.django_db
def test_the_outside_side_drops_a_rerun_call_by_its_idempotency_key(
    make_conversation,
):
    from tasks.tools import files_root

    task = one_step_task(make_conversation, "demo.notify", message="chart ready")
    crash_at(task.pk, "after_tool")
    expire_lease(task.pk)
    step(task_id=task.pk, worker_id="w")
    note = Step.objects.get(task=task)
    assert note.status == "needs_review"
    step_resolve(step=note, action="rerun", actor="staff:dad")
    run_task(task.pk)
    note.refresh_from_db()
    assert note.status == "done"
    outbox = (files_root() / "outbox.jsonl").read_text().splitlines()
    assert len(outbox) == 1
    assert note.output.meta["duplicate_dropped"] is True


@pytest.mark.django_db
def test_a_widget_output_gets_its_png_preview_at_write_time_kept_by_the_task(
    demo_task,
):
    from artifacts.preview import preview_artifact_for

    task = demo_task()
    run_task(task.pk)
    chart = Step.objects.get(task=task, position=4).output
    assert chart.media_type == "image/svg+xml"
    preview = preview_artifact_for(chart)
    assert preview is not None
    assert preview.media_type == "image/png"
    assert list(preview.sources.all()) == [chart]
    assert TaskArtifact.objects.filter(task=task, artifact=preview).exists()
    check_invariants([task.pk])


@pytest.mark.django_db
def test_a_widget_that_cannot_be_rendered_still_finishes_its_step(
    demo_task, monkeypatch
):
    from artifacts import preview as preview_mod
    from artifacts.preview import preview_status

    def boom(**kwargs):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr("artifacts.preview.preview_render", boom)
    task = demo_task()
    run_task(task.pk)
    task.refresh_from_db()
    assert task.status == Task.Status.DONE
    chart = Step.objects.get(task=task, position=4).output
    assert preview_status(chart).get("status") != preview_mod.STATUS_OK


# A step's statements, BEGIN/COMMIT and savepoints aside (docs/serving-and-
# bench.md): commit 1 is the lease renewal reserving the started event's seq,
# pick-and-start, tool_call_started; between the commits the owner's quota
# admits the payload (one read) before it is stored; commit 2 is the
# artifact (its size counted by the schema's trigger, the count read back
# against the quota), its link, the step done, the seq reservation with the
# plan's advance, and one INSERT of payload_persisted and
# tool_result_persisted. The payload is a blob (its write, link and two
# fsyncs, or a bucket's put, come between the commits).
STATEMENTS_PER_STEP = 10


def _statements(queries) -> list[str]:
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA")
    return [
        q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith(control)
    ]


@pytest.mark.django_db
def test_a_step_of_a_running_task_takes_ten_statements_in_two_commits(
    make_conversation, blob_store
):
    task = task_create(
        conversation=make_conversation(),
        title="three fetches",
        steps=[
            {"title": f"fetch {n}", "tool": "test.fetch", "args": {"size": 1024}}
            for n in range(3)
        ],
    )
    step(task_id=task.pk, worker_id="w1")  # takes the lease
    with CaptureQueriesContext(connection) as queries:
        outcome = step(task_id=task.pk, worker_id="w1")
    assert (outcome.status, outcome.position) == ("done", 2)
    statements = _statements(queries.captured_queries)
    assert len(statements) == STATEMENTS_PER_STEP, "\n".join(statements)
    # Two transactions: the call is logged before it runs; the payload's
    # event, the result and the plan's advance commit together.
    boundaries = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].upper().startswith(("SAVEPOINT", "BEGIN"))
    ]
    assert len(boundaries) == 2
    assert kinds(task.pk)[-3:] == [
        "tool_call_started",
        "payload_persisted",
        "tool_result_persisted",
    ]
    # Every output a file: the payload named is a file whose bytes match it.
    sha = Event.objects.filter(kind="payload_persisted").last().data["sha"]
    assert blob_store.path(sha).is_file()
    assert blob_store.verify(sha)
    seqs = list(Event.objects.filter(task=task).values_list("seq", flat=True))
    task.refresh_from_db()
    assert seqs == list(range(1, task.last_seq + 1))
    assert task.steps_done == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite sets a sync level per transaction"
)
@pytest.mark.parametrize("configured", ["FULL", "NORMAL"])
@pytest.mark.parametrize(
    ("tool", "start_level"), [("test.effect", "FULL"), ("test.fetch", "NORMAL")]
)
def test_a_step_begins_once_at_full_sync_only_for_outside_effects(
    configured, tool, start_level, make_conversation, blob_store, settings, monkeypatch
):
    # The configured level, put back after the test: later connections (other
    # tests' threads) open with the settings' own init_command.
    options = settings.DATABASES["default"]["OPTIONS"]
    monkeypatch.setitem(options, "init_command", f"PRAGMA synchronous={configured};")
    task = task_create(
        conversation=make_conversation(),
        title="two steps",
        steps=[{"title": f"step {n}", "tool": tool} for n in range(2)],
    )
    step(task_id=task.pk, worker_id="w1")  # takes the lease
    ran: list[tuple[str, str]] = []  # (statement, the sync level in force)
    level = [configured]

    def record(execute, statement, params, many, context):
        if statement.startswith("PRAGMA synchronous = "):
            level[0] = statement.rsplit(" ", 1)[-1]
        ran.append((statement, level[0]))
        return execute(statement, params, many, context)

    with connection.execute_wrapper(record):
        outcome = step(task_id=task.pk, worker_id="w1")

    assert (outcome.status, outcome.position) == ("done", 2)
    # One begin: the lease renewed once, the step picked and started once;
    # with outside effects at FULL, so its start is on disk before the call.
    renewals = [at for sql, at in ran if sql == statements.LEASE_RENEW]
    starts = [at for sql, at in ran if sql == statements.STEP_START_NEXT]
    assert renewals == [start_level]
    assert starts == [start_level]
    started = Event.objects.filter(task=task, kind="tool_call_started")
    assert started.count() == 2


@pytest.mark.django_db
def test_a_step_that_cannot_start_gives_back_the_seq_its_lease_renewal_reserved(
    make_conversation,
):
    task = one_step_task(make_conversation, "test.flaky", fail_times=5)
    step(task_id=task.pk, worker_id="w1")  # fails: waits out its back-off
    Task.objects.filter(pk=task.pk).update(lease_owner="w1", status="running")
    outcome = step(task_id=task.pk, worker_id="w1")  # still waiting: nothing starts
    assert outcome.error.startswith("waiting before attempt 2")
    seqs = list(Event.objects.filter(task=task).values_list("seq", flat=True))
    task.refresh_from_db()
    assert seqs == list(range(1, task.last_seq + 1))
    assert Step.objects.get(task=task).attempts == 1


def _held_by_a_dead_worker(task: Task) -> None:
    """Step 1 in flight under a worker that died; its lease still runs 30 s."""
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner="worker:dead",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
    )


def _lease_runs_out_after(real_step, task: Task, answers: list):
    def step_then_the_lease_runs_out(**kwargs):
        answers.append(real_step(**kwargs))
        Task.objects.filter(pk=task.pk, lease_owner="worker:dead").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        return answers[-1]

    return step_then_the_lease_runs_out


@pytest.mark.django_db
def test_a_lease_that_runs_out_while_the_executor_is_asked_runs_the_step(
    demo_task, monkeypatch
):
    # The end-to-end flake: runner B waited out dead runner A's 2 s lease; the
    # executor still saw it live, it ran out before step_run read the task
    # back, and B was told "nothing to run" (ran false) for a queued task.
    task = demo_task()
    _held_by_a_dead_worker(task)
    answers: list = []
    monkeypatch.setattr(
        actions, "step", _lease_runs_out_after(actions.step, task, answers)
    )
    run = actions.step_run(task=task, worker_id="worker:b")
    assert answers[0] is None  # the first look found the dead worker's lease live
    assert run.ran
    assert not run.lease_busy
    assert run.step.position == 1
    assert run.step.status == "done"
    task.refresh_from_db()
    assert task.lease_owner == "worker:b"
    assert Event.objects.filter(task=task, kind=Event.Kind.LEASE_TAKEN_OVER).exists()


@pytest.mark.django_db
def test_a_task_that_can_run_is_never_answered_nothing_to_run_while_its_lease_moves(
    demo_task, monkeypatch
):
    # However the lease moves between the executor's look and ours, a task
    # that can run answers "busy, ask again" (the API's 409), never ran=false
    # with nothing to wait for; the caller's next ask runs the step.
    task = demo_task()
    monkeypatch.setattr(actions, "step", lambda **kwargs: None)
    run = actions.step_run(task=task, worker_id="worker:b")
    assert (run.ran, run.lease_busy, run.detail) == (False, True, ERR_LEASE_CHANGING)
    _held_by_a_dead_worker(task)
    run = actions.step_run(task=task, worker_id="worker:b")
    assert run.lease_busy
    assert "worker:dead" in run.detail
    monkeypatch.undo()
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert actions.step_run(task=task, worker_id="worker:b").ran


@pytest.mark.parametrize(
    ("said", "stored"),
    [
        ("text/csv; charset=utf-8", "text/csv; charset=utf-8"),
        ("not a media type", "application/octet-stream"),
        ("text/" + "x" * 300, "application/octet-stream"),
    ],
)
def test_the_payload_names_the_media_type_the_artifact_row_stores(
    make_conversation, tool_log, said, stored
):
    """A tool's result may call its bytes anything: what the event log keeps
    for resume is what the artifact's row says, never a cut-off string."""
    task = task_create(
        conversation=make_conversation(),
        title="types",
        steps=[{"title": "f", "tool": "test.fetch", "args": {"media_type": said}}],
    )

    run_task(task.pk)

    done = Step.objects.select_related("output").get(task=task)
    assert done.output.media_type == stored
    assert envelope_read(done.pk).payload["media_type"] == stored
