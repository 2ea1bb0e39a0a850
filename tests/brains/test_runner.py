"""The runner: a brain's tool calls become executor steps on durable state."""

from __future__ import annotations

import json

import pytest

from brains.base import BrainError, BrainReply, TokenUsage, ToolCall
from brains.runner import (
    SYSTEM_PROMPT,
    TOOL_SPECS,
    LocalBackend,
    Room,
    Runner,
    request_chars,
    run_brain,
)
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
        "read_artifact, read_steps, write_note",
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


# -- every turn is built from state ------------------------------------------------

SEARCHES = [
    {"title": f"Search {n}", "tool": "demo.search", "args": {"query": "PIPA"}}
    for n in range(1, 13)
]


@pytest.fixture
def long_task(make_conversation, user):
    conversation = make_conversation(owner=user)
    return task_create(conversation=conversation, title="News", steps=SEARCHES)


def test_every_turn_sends_the_state_now_and_the_latest_turns_never_the_whole_run(
    long_task, user
):
    brain = ScriptedBrain()
    report = run_brain(
        brain=brain, backend=LocalBackend(user=user), task_id=long_task.pk
    )
    assert report.task_status == "done"
    assert report.turns == 13
    for n, messages in enumerate(brain.calls):
        opening = messages[0]
        assert opening.role == "user"
        assert "Resume context (pippa.resume/3" in opening.text
        document = json.loads(opening.text.split("\n")[1])
        # The document as it stood when this turn was asked: n steps done.
        assert document["task"]["steps_done"] == n
        # Then at most two of the brain's own turns, each answered in full.
        rest = messages[1:]
        assert [m.role for m in rest] == ["assistant", "tool"] * min(n, 2)
        for call, result in zip(rest[::2], rest[1::2], strict=True):
            assert result.tool_call_id == call.tool_calls[0].id
        if n >= 2:
            # The older turn's result is a line; the latest one is whole.
            assert set(rest[1].result) == {"earlier", "summary"}
            assert rest[3].result["step"]["position"] == n
        ids = {m.tool_call_id for m in rest if m.role == "tool"}
        assert ids <= {f"scripted-{n - 1}", f"scripted-{n}"}
    # What a turn sends does not grow with the task: once the document has
    # its next and recent steps full, each turn is the same size.
    middle = report.sent_chars[4:-4]
    assert max(middle) - min(middle) < 40
    assert report.sent_chars[-1] <= 1.5 * report.sent_chars[0]


def test_a_run_cut_and_started_again_goes_on_from_the_note_and_the_state(
    long_task, user
):
    first = ScriptedBrain(
        script=[
            call("run_next_step"),
            call("write_note", text="Searches 1-2 saved; skip the weekend ones."),
            call("run_next_step"),
        ]
    )
    # Cut after three turns, as a killed runner would be.
    run_brain(
        brain=first, backend=LocalBackend(user=user), task_id=long_task.pk, max_turns=3
    )
    second = ScriptedBrain()
    report = run_brain(
        brain=second, backend=LocalBackend(user=user), task_id=long_task.pk
    )
    opening = second.calls[0][0].text
    document = json.loads(opening.split("\n")[1])
    assert document["note"]["text"] == "Searches 1-2 saved; skip the weekend ones."
    assert document["task"]["steps_done"] == 2
    assert [s["position"] for s in document["recent"]] == [1, 2]
    assert len(second.calls[0]) == 1  # nothing of the first run's chat
    assert report.task_status == "done"
    assert report.steps_run == 10  # no step ran twice
    assert Event.objects.filter(task=long_task, kind="tool_call_started").count() == 12


def test_read_steps_answers_the_steps_the_document_leaves_out(long_task, user):
    run_brain(
        brain=ScriptedBrain(), backend=LocalBackend(user=user), task_id=long_task.pk
    )
    brain = ScriptedBrain(
        script=[
            call("read_steps", from_position=2, to_position=4),
            call("read_steps", status="done", limit=5),
            call("read_steps", status="finished"),
            call("read_steps", from_position="two"),
        ]
    )
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=long_task.pk)
    ranged = brain.calls[1][-1].result
    assert [s["position"] for s in ranged["steps"]] == [2, 3, 4]
    assert ranged["steps"][0]["output"]["artifact_class"] == 3
    paged = brain.calls[2][-1].result
    assert (len(paged["steps"]), paged["matching"], paged["next_from_position"]) == (
        5,
        12,
        6,
    )
    assert brain.calls[3][-1].result["error"].startswith("status must be one of")
    assert brain.calls[4][-1].result["error"] == (
        'bad arguments for read_steps: from_position must be a whole number, not "two"'
    )


def test_a_result_larger_than_the_brains_room_is_answered_with_what_to_ask_instead(
    long_task, user
):
    brain = ScriptedBrain(
        script=[call("read_steps", limit=50), call("read_steps", limit=1)]
    )
    run_brain(
        brain=brain,
        backend=LocalBackend(user=user),
        task_id=long_task.pk,
        room=Room(result_chars=800),
    )
    refused = brain.calls[1][-1].result["error"]
    assert "more than this brain's room for one result (800)" in refused
    assert "smaller limit" in refused
    assert [s["position"] for s in brain.calls[2][-1].result["steps"]] == [1]


def test_a_small_room_sends_fewer_turns_then_fewer_of_the_brains_words(long_task, user):
    chatty = BrainReply(
        text="Thinking aloud. " * 200,
        tool_calls=[ToolCall("c-1", "run_next_step", {})],
        stop_reason="tool_use",
    )
    brain = ScriptedBrain(script=[call("run_next_step"), chatty, call("run_next_step")])
    runner = Runner(
        brain=brain,
        backend=LocalBackend(user=user),
        task_id=long_task.pk,
        room=Room(document_chars=1500, context_tokens=2000, chars_per_token=4.0),
        max_turns=3,
    )
    runner.run()
    third = brain.calls[2]
    # Only the latest turn is left, its words shortened; its call and result whole.
    assert [m.role for m in third] == ["user", "assistant", "tool"]
    assert third[1].text.endswith("…")
    assert len(third[1].text) < len(chatty.text)
    assert third[1].tool_calls[0].id == "c-1"
    assert third[2].result["step"]["position"] == 2
    assert request_chars(SYSTEM_PROMPT, TOOL_SPECS, third) <= 6000


def test_a_small_context_learns_its_brains_tokens_and_keeps_a_quarter_for_answers(
    task, user
):
    room = Room.for_context(4096)
    assert (room.window_turns, room.context_tokens) == (1, 4096)
    assert 1500 <= room.document_chars <= 4000
    # A brain whose tokens hold two characters: the next request is fitted
    # into 3/4 of 4,096 tokens at 1.8 characters a token.
    counted = BrainReply(
        text="",
        tool_calls=[ToolCall("c-1", "run_next_step", {})],
        stop_reason="tool_use",
        tokens=TokenUsage(input_tokens=100, output_tokens=10, total_tokens=110),
    )
    brain = ScriptedBrain(script=[counted])
    runner = Runner(
        brain=brain, backend=LocalBackend(user=user), task_id=task.pk, room=room
    )
    runner.run()
    first = request_chars(SYSTEM_PROMPT, TOOL_SPECS, brain.calls[0])
    assert runner.chars_per_token == pytest.approx(first / 100 * 0.9)
    assert runner.prompt_chars() == int(4096 * 3 / 4 * first / 100 * 0.9)


def _one_turn_in_4096_tokens(brain, task, user) -> Runner:
    """A runner for one turn of a brain whose context holds 4,096 tokens."""
    return Runner(
        brain=brain,
        backend=LocalBackend(user=user),
        task_id=task.pk,
        room=Room.for_context(4096),
        max_turns=1,
    )


class _FullOnce(ScriptedBrain):
    """A local server whose context the first request overflows."""

    def complete(self, *, system, messages, tools):
        if not self.calls:
            self.calls.append(list(messages))
            raise BrainError(
                "ollama (OpenAI-compatible): HTTP 400: This model's maximum context "
                "length is 4096 tokens. However, you requested 4096 tokens",
                status=400,
                kind="http",
            )
        return super().complete(system=system, messages=messages, tools=tools)


def test_a_request_a_small_context_refuses_as_too_long_is_sent_again_smaller(
    long_task, user
):
    brain = _FullOnce(script=[call("run_next_step")])
    runner = _one_turn_in_4096_tokens(brain, long_task, user)
    before = runner.prompt_chars()

    report = runner.run()

    assert len(brain.calls) == 2
    assert runner.prompt_chars() < before
    assert report.turns == 1
    assert len(report.sent_chars) == 1


def test_a_brain_error_that_is_not_about_the_context_ends_the_run(long_task, user):
    class Down(ScriptedBrain):
        def complete(self, *, system, messages, tools):
            self.calls.append(list(messages))
            raise BrainError("HTTP 400: bad tool schema", status=400, kind="http")

    brain = Down()
    runner = _one_turn_in_4096_tokens(brain, long_task, user)

    with pytest.raises(BrainError):
        runner.run()
    assert len(brain.calls) == 1
