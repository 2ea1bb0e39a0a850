"""The runner: a brain's tool calls become executor steps on durable state."""

from __future__ import annotations

import pytest

from brains.base import BrainReply, ToolCall
from brains.runner import LocalBackend, run_brain
from brains.scripted import ScriptedBrain
from tasks.models import Event, Step, Task
from tasks.plan import task_create

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = [
    {"title": "Fetch closes", "tool": "demo.closes", "args": {"end": "2024-01-31"}},
    {"title": "Chart them", "tool": "demo.chart", "args": {"source": 1}},
]


@pytest.fixture
def task(make_conversation, user):
    conversation = make_conversation(owner=user)
    return task_create(conversation=conversation, title="Closes chart", steps=PLAN)


def call(name, **args):
    return BrainReply(
        text="", tool_calls=[ToolCall(f"c-{name}", name, args)], stop_reason="tool_use"
    )


def test_a_scripted_brain_drives_a_task_to_done_and_is_recorded_on_it(task, user):
    report = run_brain(
        brain=ScriptedBrain(brain="codex"),
        backend=LocalBackend(user=user),
        task_id=task.pk,
        worker="test-runner",
    )
    task.refresh_from_db()
    assert report.task_status == "done"
    assert report.steps_run == 2
    assert task.status == Task.Status.DONE
    assert task.brain == "codex"
    assert list(task.steps.values_list("status", flat=True)) == ["done", "done"]
    assert Event.objects.filter(task=task, kind="brain_changed").count() == 1
    assert task.lease_owner == ""


def test_the_brain_reads_the_resume_context_in_its_first_message(task, user):
    brain = ScriptedBrain()
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    opening = brain.calls[0][0].text
    assert "Resume context" in opening
    assert "Fetch closes" in opening


def test_a_tool_call_to_an_unknown_tool_is_answered_with_an_error(task, user):
    brain = ScriptedBrain(script=[call("format_disk")])
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    result = brain.calls[1][-1].result
    assert "unknown tool 'format_disk'" in result["error"]
    assert Step.objects.filter(task=task, status="done").count() == 0


def test_read_artifact_returns_metadata_and_a_text_excerpt(task, user):
    brain = ScriptedBrain(script=[call("run_next_step")])
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    output = Step.objects.get(task=task, position=1).output
    brain = ScriptedBrain(script=[call("read_artifact", artifact_id=output.pk)])
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    result = brain.calls[1][-1].result
    assert result["sha256"] == output.sha256
    assert result["excerpt"].startswith("date,close")


def test_another_users_artifact_cannot_be_read_by_the_brain(
    task, user, make_conversation, make_user
):
    stranger = make_user()
    other_task = task_create(
        conversation=make_conversation(owner=stranger), title="theirs", steps=PLAN[:1]
    )
    run_brain(
        brain=ScriptedBrain(),
        backend=LocalBackend(user=stranger),
        task_id=other_task.pk,
    )
    secret = Step.objects.get(task=other_task, position=1).output
    brain = ScriptedBrain(script=[call("read_artifact", artifact_id=secret.pk)])
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    assert "not found" in brain.calls[1][-1].result["error"]


def test_rewrite_plan_appends_a_step_and_a_done_step_cannot_change(task, user):
    brain = ScriptedBrain(script=[call("run_next_step")])
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    done = Step.objects.get(task=task, position=1)
    pending = Step.objects.get(task=task, position=2)
    keep = [
        {"id": done.pk, "title": done.title, "tool": done.tool, "args": done.args},
        {
            "id": pending.pk,
            "title": pending.title,
            "tool": pending.tool,
            "args": pending.args,
        },
        {"title": "Closes again", "tool": "demo.closes", "args": {"end": "2024-02-29"}},
    ]
    changed = [{**keep[0], "args": {"end": "2025-01-01"}}, *keep[1:]]
    brain = ScriptedBrain(
        script=[call("rewrite_plan", steps=changed), call("rewrite_plan", steps=keep)]
    )
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    refused = brain.calls[1][-1].result
    accepted = brain.calls[2][-1].result
    assert "cannot change" in refused["error"]
    assert accepted["task"]["steps_total"] == 3
    assert Step.objects.filter(task=task).count() == 3


def test_starting_a_brain_on_a_paused_task_queues_it_again(make_conversation, user):
    paused = task_create(
        conversation=make_conversation(owner=user), title="p", steps=PLAN, queue=False
    )
    report = run_brain(
        brain=ScriptedBrain(), backend=LocalBackend(user=user), task_id=paused.pk
    )
    assert report.task_status == "done"


def test_the_pippa_brain_command_runs_a_task_with_the_scripted_brain(task):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("pippa_brain", str(task.pk), "--brain", "scripted", stdout=out)
    task.refresh_from_db()
    assert task.status == "done"
    assert "2 steps run" in out.getvalue()


def bad(call_id, name, error):
    return BrainReply(
        text="",
        tool_calls=[ToolCall(call_id, name, {}, error=error)],
        stop_reason="tool_calls",
    )


def test_malformed_calls_are_answered_with_a_sentence_and_the_run_goes_on(task, user):
    brain = ScriptedBrain(
        script=[
            bad("c1", "rewrite_plan", "the arguments of rewrite_plan are not JSON"),
            bad("c2", "", "the tool call names no tool"),
            call("launch_rockets", target="moon"),
            call("read_artifact", artifact_id="the closes"),
            call("rewrite_plan", steps="fetch, then chart"),
            call("rewrite_plan", steps=[]),
            call(
                "rewrite_plan", steps=[{"title": "x", "tool": "demo.closes", "args": 3}]
            ),
            call("run_next_step", please="now"),
        ]
    )
    report = run_brain(
        brain=brain, backend=LocalBackend(user=user), task_id=task.pk, max_turns=9
    )
    errors = [brain.calls[n][-1].result.get("error") for n in range(1, 8)]
    assert errors == [
        "the arguments of rewrite_plan are not JSON",
        "the tool call names no tool",
        "unknown tool 'launch_rockets'; use one of: run_next_step, rewrite_plan, "
        "read_artifact, read_resume_context",
        "bad arguments for read_artifact: artifact_id must be an integer (an "
        'artifact\'s id), not "the closes"',
        "bad arguments for rewrite_plan: steps must be a list of steps (objects "
        "with title, tool and args), not a string",
        "a plan needs at least one step",
        "step 1: args must be a dict",
    ]
    # The last call had an argument run_next_step does not take: it ran anyway.
    assert brain.calls[8][-1].result["step"]["status"] == "done"
    assert report.turns == 9
    assert report.refused == 7
    assert report.stopped_because == "the brain answered without a tool call"
    assert [s["title"] for s in PLAN] == list(
        Step.objects.filter(task=task)
        .order_by("position")
        .values_list("title", flat=True)
    )


def test_a_run_of_nothing_but_malformed_calls_stops_at_its_turn_budget(task, user):
    brain = ScriptedBrain(
        script=[bad(f"c{n}", "run_next_step", "not JSON") for n in range(10)]
    )
    report = run_brain(
        brain=brain, backend=LocalBackend(user=user), task_id=task.pk, max_turns=4
    )
    task.refresh_from_db()
    assert report.turns == 4
    assert report.stopped_because == "turn limit (4) reached"
    assert report.steps_run == 0
    assert task.lease_owner == ""
    assert Event.objects.filter(task=task, kind="brain_turn").count() == 4


@pytest.mark.parametrize("reason", ["length", "max_tokens", "MAX_TOKENS"])
def test_an_answer_cut_off_before_a_whole_call_ends_the_run_and_says_why(
    task, user, reason
):
    cut = BrainReply(
        text="",
        tool_calls=[
            ToolCall(
                id="c1",
                name="rewrite_plan",
                arguments={},
                error="the arguments of rewrite_plan are not JSON",
            )
        ],
        stop_reason=reason,
    )
    brain = ScriptedBrain(script=[cut, call("run_next_step")])
    report = run_brain(
        brain=brain, backend=LocalBackend(user=user), task_id=task.pk, max_turns=5
    )
    assert report.turns == 1  # never asked again
    assert report.stopped_because.startswith("the answer was cut off")
    assert f"({reason})" in report.stopped_because
    assert task.steps.filter(status="done").count() == 0


def test_a_cut_off_answer_that_holds_a_whole_call_runs_it(task, user):
    whole = call("run_next_step")
    cut = BrainReply(text="", tool_calls=whole.tool_calls, stop_reason="length")
    brain = ScriptedBrain(script=[cut])
    report = run_brain(
        brain=brain, backend=LocalBackend(user=user), task_id=task.pk, max_turns=2
    )
    assert report.tool_calls[0] == "run_next_step"
    assert task.steps.filter(status="done").count() == 1
