"""The plan: created with its tools' classes, rewritten like a todo list."""

from __future__ import annotations

import pytest

from tasks.executor import step
from tasks.models import Event, Step, Task
from tasks.plan import PlanError, plan_rewrite, task_create
from tasks.tools import ToolNotFound, tool_get, tools_load
from tests.support.executing import expire_lease, run_task

PLAN = [
    {"title": "fetch", "tool": "test.fetch", "args": {"size": 64}},
    {"title": "snapshot", "tool": "test.snapshot", "args": {}},
    {"title": "file", "tool": "test.file", "args": {}},
]


def plan_of(task: Task) -> list[tuple]:
    return list(
        Step.objects.filter(task=task)
        .order_by("position")
        .values_list("position", "title", "status")
    )


@pytest.mark.django_db
def test_task_create_files_steps_in_order_with_each_tools_class(make_conversation):
    task = task_create(
        conversation=make_conversation(), title="Chart", steps=PLAN, brain="claude"
    )
    steps = list(Step.objects.filter(task=task).order_by("position"))
    assert [(s.position, s.tool, s.artifact_class) for s in steps] == [
        (1, "test.fetch", 2),
        (2, "test.snapshot", 3),
        (3, "test.file", 1),
    ]
    assert steps[0].args == {"size": 64}
    assert (task.status, task.brain, task.steps_total, task.steps_done) == (
        "queued",
        "claude",
        3,
        0,
    )
    assert list(Event.objects.filter(task=task).values_list("kind", flat=True)) == [
        "task_created",
        "task_queued",
    ]


@pytest.mark.django_db
def test_task_create_without_queue_leaves_the_task_paused(make_conversation):
    task = task_create(
        conversation=make_conversation(), title="later", steps=PLAN, queue=False
    )
    assert task.status == "paused"
    assert step(task_id=task.pk, worker_id="w") is None


@pytest.mark.django_db
def test_a_tool_that_declares_no_class_is_filed_as_class_3():
    assert tool_get("test.unclassed").artifact_class == 3
    assert tool_get("test.effect").side_effects is True


@pytest.mark.django_db
def test_tools_listed_in_pippa_tools_are_imported(settings):
    settings.PIPPA_TOOLS = ["tests.support.tools"]
    loaded = tools_load()
    assert "tests.support.tools" in loaded
    assert tool_get("test.render").artifact_class == 4
    with pytest.raises(ToolNotFound, match="no tool named 'nope'"):
        tool_get("nope")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([], "at least one step"),
        ([{"title": "x", "tool": "no.such.tool"}], "no tool named 'no.such.tool'"),
        ([{"title": "", "tool": "test.fetch"}], "needs a title"),
        ([{"title": "x", "tool": "test.fetch", "args": [1]}], "args must be a dict"),
        (
            [{"title": "x", "tool": "test.fetch", "args": {"blob": "x" * 5000}}],
            "args must stay small",
        ),
        (
            [{"title": "x", "tool": "test.fetch", "max_attempts": 0}],
            "max_attempts",
        ),
    ],
)
def test_task_create_refuses_a_bad_plan_and_writes_nothing(
    make_conversation, steps, message
):
    with pytest.raises(PlanError, match=message):
        task_create(conversation=make_conversation(), title="bad", steps=steps)
    assert not Task.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_rewrite_keeps_done_steps_and_reorders_drops_and_adds_pending_ones(
    make_conversation,
):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    step(task_id=task.pk, worker_id="w")
    expire_lease(task.pk)
    done, snap, file_ = Step.objects.filter(task=task).order_by("position")
    output = done.output_id
    plan_rewrite(
        task=task,
        steps=[
            {"id": done.pk},
            {"id": file_.pk, "title": "file first now"},
            {"title": "new render", "tool": "test.render", "args": {"source": 1}},
        ],
    )
    assert plan_of(task) == [
        (1, "fetch", "done"),
        (2, "file first now", "pending"),
        (3, "new render", "pending"),
    ]
    assert not Step.objects.filter(pk=snap.pk).exists()
    done.refresh_from_db()
    assert done.output_id == output
    task.refresh_from_db()
    assert (task.steps_total, task.steps_done) == (3, 1)
    event = Event.objects.get(task=task, kind="plan_rewritten")
    assert (event.data["kept"], event.data["added"], event.data["dropped"]) == (2, 1, 1)
    run_task(task.pk)
    task.refresh_from_db()
    assert task.status == "done"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"args": {"size": 1}},
            "step 1 is done: its title, tool and args cannot change",
        ),
        ({"tool": "test.snapshot"}, "cannot change"),
    ],
)
def test_rewrite_refuses_to_change_a_done_step(make_conversation, change, message):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    step(task_id=task.pk, worker_id="w")
    expire_lease(task.pk)
    ids = list(
        Step.objects.filter(task=task).order_by("position").values_list("pk", flat=True)
    )
    with pytest.raises(PlanError, match=message):
        plan_rewrite(
            task=task, steps=[{"id": ids[0], **change}, {"id": ids[1]}, {"id": ids[2]}]
        )
    assert Step.objects.get(pk=ids[0]).args == {"size": 64}


@pytest.mark.django_db
def test_rewrite_refuses_to_drop_or_move_a_done_step(make_conversation):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    step(task_id=task.pk, worker_id="w")
    expire_lease(task.pk)
    ids = list(
        Step.objects.filter(task=task).order_by("position").values_list("pk", flat=True)
    )
    with pytest.raises(PlanError, match="step 1 is done and has history"):
        plan_rewrite(task=task, steps=[{"id": ids[1]}, {"id": ids[2]}])
    with pytest.raises(PlanError, match="finished steps must stay first"):
        plan_rewrite(task=task, steps=[{"id": ids[1]}, {"id": ids[0]}, {"id": ids[2]}])
    assert [p for p, *_ in plan_of(task)] == [1, 2, 3]


@pytest.mark.django_db
def test_rewrite_refuses_while_a_worker_holds_the_lease(make_conversation):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    step(task_id=task.pk, worker_id="w")
    with pytest.raises(PlanError, match="a worker is running this task"):
        plan_rewrite(task=task, steps=PLAN)


@pytest.mark.django_db
def test_rewrite_that_adds_steps_to_a_done_task_reopens_it(make_conversation):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN[:1])
    run_task(task.pk)
    task.refresh_from_db()
    assert task.status == "done"
    first = Step.objects.get(task=task)
    plan_rewrite(
        task=task, steps=[{"id": first.pk}, {"title": "more", "tool": "test.fetch"}]
    )
    task.refresh_from_db()
    assert (task.status, task.steps_done, task.steps_total) == ("queued", 1, 2)
    assert task.finished_at is None
    run_task(task.pk)
    task.refresh_from_db()
    assert task.status == "done"


@pytest.mark.django_db
def test_a_plan_item_that_claims_a_status_the_step_does_not_have_is_refused(
    make_conversation,
):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    run_task(task.pk, limit=1)
    expire_lease(task.pk)
    first, second, third = Step.objects.filter(task=task).order_by("position")
    before = plan_of(task)
    for steps, message in (
        (
            [{"id": first.pk}, {"id": second.pk, "status": "done"}, {"id": third.pk}],
            "step 2 is pending, not done: a plan rewrite never changes a step's status",
        ),
        (
            [{"id": first.pk, "status": "pending"}, {"id": second.pk}],
            "step 1 is done, not pending",
        ),
        (
            [
                {"id": first.pk},
                {"title": "new", "tool": "test.fetch", "status": "done"},
            ],
            "step 2 is new, so its status can only be pending, not done",
        ),
        (
            [{"id": first.pk, "status": "finished"}],
            "step 1: status must be one of pending, running, done",
        ),
    ):
        with pytest.raises(PlanError) as caught:
            plan_rewrite(task=task, steps=steps)
        assert str(caught.value).startswith(message)
    assert plan_of(task) == before
    assert not Event.objects.filter(task=task, kind="plan_rewritten").exists()


@pytest.mark.django_db
def test_a_plan_item_whose_status_matches_is_kept_like_a_todo_list(make_conversation):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    run_task(task.pk, limit=1)
    expire_lease(task.pk)
    first, second, _ = Step.objects.filter(task=task).order_by("position")
    plan_rewrite(
        task=task,
        steps=[
            {"id": first.pk, "status": "done"},
            {"id": second.pk, "status": "pending"},
            {"title": "chart", "tool": "test.fetch", "status": "pending"},
        ],
    )
    assert plan_of(task) == [
        (1, "fetch", "done"),
        (2, "snapshot", "pending"),
        (3, "chart", "pending"),
    ]


@pytest.mark.django_db
def test_task_create_refuses_a_new_step_that_claims_to_be_done(make_conversation):
    conversation = make_conversation()
    with pytest.raises(PlanError, match="step 1 is new, so its status can only be"):
        task_create(
            conversation=conversation,
            title="t",
            steps=[{"title": "x", "tool": "test.fetch", "status": "done"}],
        )
    assert not Task.objects.filter(conversation=conversation).exists()
