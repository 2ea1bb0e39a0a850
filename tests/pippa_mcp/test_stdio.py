"""The MCP server as a process: killed with SIGKILL mid-step, resumed by another client.

The server is ``manage.py pippa_mcp`` over stdio (or uvicorn serving
/mcp/), driven by the SDK's own client. Real tool calls are counted through
the side-channel file the test tools append to.
"""

from __future__ import annotations

import os
import signal
import time

import anyio
import pytest
from django.core.management import CommandError, call_command
from mcp.shared.exceptions import MCPError

from artifacts.store import default_store
from council.models import Turn
from council.services import round_start
from tasks.models import Conversation, Event, Step
from tests.pippa_mcp.conftest import (
    call,
    data,
    error,
    http_session,
    started_calls,
    task_create,
)
from tests.support.asyncrun import run_async
from tests.support.executing import check_invariants, expire_lease, invocations

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_PLAN = [
    {"title": "Fetch closes", "tool": "test.fetch", "args": {}},
    {"title": "Search the news", "tool": "test.snapshot", "args": {}},
    {"title": "Live quote", "tool": "test.snapshot", "args": {"sleep_first": 120}},
    {"title": "Chart", "tool": "test.render", "args": {"source": 2}},
]


def _wait_for_start(log, step_id: int) -> int:
    """Block until the tool of ``step_id`` has started; return the server's pid."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        calls = started_calls(log, step_id)
        if calls:
            return calls[-1]["pid"]
        time.sleep(0.05)
    raise AssertionError(f"step {step_id} never started")


def _plan(task: dict) -> list[tuple]:
    return [(s["id"], s["position"], s["title"], s["tool"]) for s in task["steps"]]


def _shas(task: dict) -> dict[int, str]:
    return {s["position"]: s["output"]["sha256"] for s in task["steps"] if s["output"]}


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_killed_mid_step_is_resumed_by_a_client_with_another_name(
    transport, stdio_session, http_server, mcp_url, token_for, user, tool_log
):
    token = token_for(user)
    if transport == "stdio":

        def first():
            return stdio_session("--user", user.username, name="claude-code")

        def second():
            return stdio_session(env={"PIPPA_API_TOKEN": token}, name="gemini-cli")
    else:
        url, server = http_server()

        def first():
            return http_session(url, token, name="claude-code")

        def second():
            # Another server process answers: the state is in the database.
            return http_session(mcp_url, token, name="gemini-cli")

    async def until_killed():
        async with first() as mcp:
            task = await task_create(
                mcp, steps=SLOW_PLAN, title="Brief", conversation_title="PIPA"
            )
            for _ in range(2):
                await call(mcp, "run_next_step", {"task_id": task["id"]})
            before = await call(mcp, "get_task", {"task_id": task["id"]})
            slow = before["steps"][2]["id"]
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(
                        mcp.call_tool, "run_next_step", {"task_id": task["id"]}
                    )
                    pid = await anyio.to_thread.run_sync(
                        _wait_for_start, tool_log, slow
                    )
                    os.kill(pid, signal.SIGKILL)
                    scope.cancel()
            return before, pid

    before, pid = run_async(until_killed)
    if transport == "http":
        assert server.wait(timeout=60) == -signal.SIGKILL
        assert pid == server.pid
    task_id = before["id"]
    killed = Step.objects.get(task_id=task_id, position=3)
    assert killed.status == "running"  # the envelope is open: uncertain

    async def resume(expire):
        async with second() as mcp:
            context = await call(mcp, "resume_context", {"task_id": task_id})
            busy = await mcp.call_tool("run_next_step", {"task_id": task_id})
            await anyio.to_thread.run_sync(expire, task_id)
            runs = []
            for _ in range(3):
                runs.append(await call(mcp, "run_next_step", {"task_id": task_id}))
            after = await call(mcp, "get_task", {"task_id": task_id})
            return context, busy, runs, after

    context, busy, runs, after = run_async(resume, expire_lease)
    # The new client reads the same plan and the outputs made before the kill.
    assert context["counts"] == {"done": 2, "running": 1, "pending": 1}
    assert [s["position"] for s in context["recent"]] == [1, 2]
    assert context["next"][0]["position"] == 3
    assert error(busy).startswith("another worker (mcp:dad:agent#")
    assert "holds the task's lease until" in error(busy)
    assert _plan(after) == _plan(before)
    assert {p: s for p, s in _shas(after).items() if p <= 2} == _shas(before)
    assert after["status"] == "done"
    assert runs[0]["rule"] == "class3_issue_again_unshown"
    calls = invocations(tool_log)
    steps = {s["position"]: s["id"] for s in after["steps"]}
    # The snapshot shown before the kill is never issued again; the one that
    # was cut off was never persisted (never shown), so it may be.
    assert calls[steps[2]] == 1
    assert calls[steps[3]] == 2
    assert calls[steps[1]] == calls[steps[4]] == 1
    check_invariants([task_id])


@pytest.mark.slow
def test_a_server_killed_before_a_snapshots_result_committed_takes_it_again(
    stdio_session, user, tool_log
):
    """The snapshot's file was written but no row named it: it was never
    shown, so resume takes the snapshot again (class 3's rule)."""
    plan = [{"title": "Search", "tool": "test.snapshot", "args": {}}]

    async def until_killed():
        # The server kills itself (SIGKILL) right after the payload file is
        # written, before the commit that names it.
        async with stdio_session(
            "--user", user.username, env={"PIPPA_CRASHPOINT": "after_blob"}
        ) as mcp:
            task = await task_create(mcp, steps=plan)
            try:
                await mcp.call_tool("run_next_step", {"task_id": task["id"]})
            except MCPError as exc:
                return task["id"], str(exc)
            return task["id"], "answered"

    task_id, outcome = run_async(until_killed)
    assert outcome == "Connection closed"
    assert not Event.objects.filter(task_id=task_id, kind="payload_persisted").exists()
    expire_lease(task_id)

    async def resume():
        async with stdio_session("--user", user.username, name="codex-cli") as mcp:
            return await call(mcp, "run_next_step", {"task_id": task_id})

    ran = run_async(resume)
    assert ran["rule"] == "class3_issue_again_unshown"
    saved = Event.objects.get(task_id=task_id, kind="payload_persisted").data["sha"]
    assert ran["step"]["output"]["sha256"] == saved
    assert invocations(tool_log)[ran["step"]["id"]] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tool", "boundary", "rule", "resume_with"),
    [
        ("test.fetch", "after_started", "class2_fetch_again", "complete_step"),
        ("test.snapshot", "after_blob", "class3_issue_again_unshown", "run_next_step"),
        ("test.effect", "after_blob", "side_effects_review", "complete_step"),
    ],
    ids=["fetch-sent-again", "snapshot-taken-by-its-tool", "outside-effects-wait"],
)
def test_a_server_killed_between_complete_steps_two_commits_leaves_the_step_to_its_class(
    stdio_session, user, tool_log, tool, boundary, rule, resume_with
):
    """An agent's own output goes through a tool's envelope: killed between
    its two commits, the step is open, and its class decides what happens."""
    plan = [
        {"title": "What the agent did", "tool": tool, "args": {}},
        {"title": "Then", "tool": "test.fetch", "args": {}},
    ]
    content = "Found it myself: the dividend is paid on 14 May."

    async def until_killed():
        async with stdio_session(
            "--user", user.username, env={"PIPPA_CRASHPOINT": boundary}
        ) as mcp:
            task = await task_create(mcp, steps=plan)
            arguments = {
                "task_id": task["id"],
                "step_id": task["steps"][0]["id"],
                "content": content,
            }
            try:
                await mcp.call_tool("complete_step", arguments)
            except MCPError as exc:
                return arguments, str(exc)
            return arguments, "answered"

    arguments, outcome = run_async(until_killed)
    assert outcome == "Connection closed"
    task_id, step_id = arguments["task_id"], arguments["step_id"]
    assert Step.objects.get(pk=step_id).status == "running"
    (started,) = Event.objects.filter(step_id=step_id, kind="tool_call_started")
    assert started.data["by"] == "agent"
    closing = ("payload_persisted", "tool_result_persisted")
    assert not Event.objects.filter(step_id=step_id, kind__in=closing).exists()
    expire_lease(task_id)

    async def resume():
        async with stdio_session("--user", user.username, name="codex-cli") as mcp:
            context = await call(mcp, "resume_context", {"task_id": task_id})
            if resume_with == "complete_step":
                answer = await mcp.call_tool("complete_step", arguments)
            else:
                answer = await mcp.call_tool("run_next_step", {"task_id": task_id})
            return context, answer

    context, answer = run_async(resume)
    # What the resume document said is what happened.
    assert context["next"][0]["resume"]["rule"] == rule
    step = Step.objects.select_related("output").get(pk=step_id)
    resolved = Event.objects.get(step_id=step_id, kind="uncertain_resolved")
    assert resolved.data["rule"] == rule
    if rule == "side_effects_review":
        # A call with outside effects is never taken as done without a person.
        refused = data(answer)
        assert (refused["completed"], refused["rule"]) == (False, rule)
        assert refused["detail"] == "needs you: the tool has outside effects"
        assert step.status == refused["step"]["status"] == "needs_review"
        assert invocations(tool_log)[step_id] == 0
    elif resume_with == "complete_step":
        # Sent again, the agent's bytes are the call made again: class 2's rule.
        assert step.status == "done"
        assert data(answer)["rule"] == rule
        assert default_store().get(step.output.sha256) == content.encode()
        assert invocations(tool_log)[step_id] == 0
    else:
        # No snapshot was saved, so none was shown: its tool takes it anew.
        assert step.status == "done"
        assert data(answer)["rule"] == rule
        assert invocations(tool_log)[step_id] == 1
        assert default_store().get(step.output.sha256) != content.encode()
    check_invariants([task_id])


@pytest.mark.slow
def test_the_stdio_server_of_another_user_sees_none_of_it(
    stdio_session, make_user, make_task, user
):
    task = make_task(conversation=Conversation.objects.create(owner=user, title="m"))
    other = make_user(username="mallory")

    async def scenario():
        async with stdio_session("--user", other.username) as mcp:
            listed = await call(mcp, "list_conversations", {})
            probe = await mcp.call_tool("get_task", {"task_id": task.pk})
            return listed, probe

    listed, probe = run_async(scenario)
    assert listed["conversations"] == []
    assert error(probe) == f"task {task.pk} not found (or not yours)"


def test_the_stdio_command_refuses_to_start_without_a_known_user(
    user, token_for, monkeypatch
):
    monkeypatch.delenv("PIPPA_API_TOKEN", raising=False)
    with pytest.raises(CommandError, match="say who the server acts as"):
        call_command("pippa_mcp")
    with pytest.raises(CommandError, match="no active user named 'nobody'"):
        call_command("pippa_mcp", "--user", "nobody")
    with pytest.raises(CommandError, match="token is unknown, revoked"):
        call_command("pippa_mcp", "--token", "pip_wrong")


def _nested(depth: int):
    value = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.slow
def test_the_stdio_server_answers_what_the_sdk_cannot_parse_and_keeps_serving(
    stdio_session, user
):
    async def scenario():
        async with stdio_session("--user", user.username) as mcp:
            with anyio.fail_after(30):
                try:
                    await mcp.call_tool(
                        "get_task", {"task_id": 1, "deep": _nested(200)}
                    )
                except MCPError as exc:
                    refused = str(exc)
                else:
                    refused = "answered"
                listed = await call(mcp, "list_conversations", {})
            return refused, listed

    refused, listed = run_async(scenario)
    assert "could not be read (recursion limit exceeded" in refused
    assert "send flatter JSON" in refused
    assert listed["conversations"] == []


@pytest.mark.slow
def test_the_stdio_server_advertises_only_what_it_serves_and_types_strictly(
    stdio_session, user
):
    async def scenario():
        async with stdio_session("--user", user.username) as mcp:
            capabilities = mcp.initialize_result.capabilities
            as_bool = await mcp.call_tool("get_task", {"task_id": True})
            as_text = await mcp.call_tool("get_task", {"task_id": "1"})
            flag = await mcp.call_tool(
                "create_task",
                {
                    "title": "t",
                    "conversation_title": "c",
                    "steps": [{"title": "s", "tool": "test.fetch", "args": {}}],
                    "queue": "false",
                },
            )
            return capabilities, as_bool, as_text, flag

    capabilities, as_bool, as_text, flag = run_async(scenario)
    assert capabilities.prompts is None
    assert capabilities.tools is not None
    assert capabilities.resources is not None
    assert error(as_bool).startswith("bad arguments for get_task: task_id:")
    assert error(as_text).startswith("bad arguments for get_task: task_id:")
    assert error(flag).startswith("bad arguments for create_task: queue:")
    assert not Conversation.objects.exists()


@pytest.mark.slow
def test_a_staff_users_server_reads_and_writes_only_its_own_council_rounds(
    stdio_session, make_user, user
):
    conversation = Conversation.objects.create(owner=user, title="Council")
    council_round = round_start(
        conversation=conversation, topic="PIPA", participants=[("claude", "claude")]
    )
    participant = council_round.participants.get()
    boss = make_user(username="boss", is_staff=True, is_superuser=True)

    async def scenario():
        async with stdio_session("--user", boss.username) as mcp:
            read = await mcp.call_tool(
                "council_context", {"round_id": council_round.pk}
            )
            spoke = await mcp.call_tool(
                "council_turn_add",
                {
                    "round_id": council_round.pk,
                    "participant_id": participant.pk,
                    "text": "a staff user's words in Dad's round",
                },
            )
            return read, spoke

    read, spoke = run_async(scenario)
    assert error(read) == error(spoke) == "No such council round."
    assert not Turn.objects.exists()
