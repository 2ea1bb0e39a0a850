"""The MCP server over streamable HTTP at /mcp/, driven by the SDK's own client."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from artifacts.models import Artifact
from tasks.models import Event, Step, Task
from tests.pippa_mcp.conftest import (
    PLAN,
    call,
    data,
    error,
    http_session,
    task_create,
)
from tests.support.asyncrun import run_async
from tests.support.executing import invocations

# The SDK's client against the live server.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDGET = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60">'
    '<rect width="120" height="60" fill="#2a6"/>'
    '<text x="10" y="35" font-size="14">PIPA +3%</text></svg>'
)
TOOLS = {
    "list_conversations",
    "list_tasks",
    "list_step_tools",
    "create_task",
    "get_task",
    "rewrite_plan",
    "resume_context",
    "run_next_step",
    "pause_task",
    "resume_task",
    "cancel_task",
    "decision_choices",
    "decide_step",
    "artifact_read",
    "artifact_store",
    "council_round_start",
    "council_rounds",
    "council_context",
    "council_turn_add",
}


def run(scenario, *args):
    return run_async(scenario, *args)


def test_the_tool_list_describes_each_tool_for_a_model(mcp_url, token_for, user):
    async def scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            listed = await mcp.list_tools()
            templates = await mcp.list_resource_templates()
            return listed.tools, templates.resource_templates

    tools, templates = run(scenario)
    by_name = {t.name: t for t in tools}
    assert set(by_name) == TOOLS
    assert "snapshot" in by_name["get_task"].description
    assert "never re-run" in by_name["list_step_tools"].description
    assert "Read it first" in by_name["resume_context"].description
    assert "write before show" in by_name["run_next_step"].description
    assert {t.uri_template for t in templates} == {
        "pippa://task/{task_id}",
        "pippa://artifact/{artifact_id}",
    }


def test_a_task_is_created_and_run_step_by_step_with_progress(
    mcp_url, token_for, user, tool_log
):
    progress: list[list[tuple[float, str]]] = []

    async def on_progress(value, total, message):
        progress[-1].append((value, message))

    async def scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            task = await task_create(
                mcp, title="Chart PIPA", conversation_title="Closes"
            )
            runs = []
            for _ in range(3):
                progress.append([])
                runs.append(
                    data(
                        await mcp.call_tool(
                            "run_next_step",
                            {"task_id": task["id"], "worker": "laptop"},
                            progress_callback=on_progress,
                        )
                    )
                )
            after = await call(mcp, "get_task", {"task_id": task["id"]})
            return task, runs, after

    task, runs, after = run(scenario)
    assert [s["status"] for s in task["steps"]] == ["pending"] * 3
    assert [s["artifact_class"] for s in task["steps"]] == [2, 3, 4]
    assert [r["step"]["status"] for r in runs] == ["done"] * 3
    fetched = runs[0]["step"]["output"]
    assert fetched["artifact_class"] == 2
    assert fetched["excerpt"].startswith(f"task {task['id']} step")
    assert fetched["uri"] == f"pippa://artifact/{fetched['id']}"
    # Write before show: the answer names bytes that are already stored.
    assert Artifact.objects.get(pk=fetched["id"]).sha256 == fetched["sha256"]
    assert after["status"] == "done"
    assert after["steps_done"] == 3
    assert [s["output"]["sha256"] for s in after["steps"]] == [
        r["step"]["output"]["sha256"] for r in runs
    ]
    assert progress[0][0] == (0, "running step 1 of 3: Fetch closes")
    assert progress[-1][-1] == (3, "step 3 is done")
    for reported in progress:
        # Within one call progress only grows.
        values = [v for v, _ in reported]
        assert values == sorted(set(values))
    assert Task.objects.get(pk=task["id"]).conversation.owner == user
    assert sum(invocations(tool_log).values()) == 3


def test_a_plan_rewrite_that_would_change_history_is_refused_and_changes_nothing(
    mcp_url, token_for, user
):
    async def scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            task = await task_create(mcp)
            await mcp.call_tool("run_next_step", {"task_id": task["id"]})
            first, second, third = (s["id"] for s in task["steps"])
            refused = [
                error(
                    await mcp.call_tool(
                        "rewrite_plan", {"task_id": task["id"], "steps": steps}
                    )
                )
                for steps in (
                    # edit a done step
                    [{"id": first, "title": "Fetch other closes"}, {"id": second}],
                    # drop a done step
                    [{"id": second}, {"id": third}],
                    # claim a status the step does not have
                    [{"id": first, "status": "done"}, {"id": second, "status": "done"}],
                )
            ]
            kept = await call(
                mcp,
                "rewrite_plan",
                {
                    "task_id": task["id"],
                    "steps": [
                        {"id": first, "status": "done"},
                        {"id": second, "status": "pending"},
                        {"title": "Summarise", "tool": "test.fetch"},
                        {"id": third},
                    ],
                },
            )
            return task, refused, kept

    task, refused, kept = run(scenario)
    assert refused[0] == (
        "step 1 is done: its title, tool and args cannot change (retry or branch instead)"
    )
    assert refused[1] == (
        "step 1 is done and has history (it was attempted or finished); it cannot be dropped"
    )
    assert refused[2].startswith("step 2 is pending, not done: a plan rewrite never")
    assert [s["title"] for s in kept["steps"]] == [
        "Fetch closes",
        "Search the news",
        "Summarise",
        "Chart",
    ]
    assert kept["steps"][0]["status"] == "done"
    assert Event.objects.filter(task_id=task["id"], kind="plan_rewritten").count() == 1


def test_bad_arguments_get_a_plain_tool_error_and_the_server_keeps_serving(
    mcp_url, token_for, user
):
    calls = [
        (
            "get_task",
            {"task_id": "abc"},
            "bad arguments for get_task: task_id: Input should be a valid integer",
        ),
        ("get_task", {}, "bad arguments for get_task: task_id: Field required"),
        (
            "create_task",
            {"title": "t", "conversation_title": "c", "steps": []},
            "bad arguments for create_task: steps: List should have at least 1 item",
        ),
        ("create_task", {"title": "t", "steps": PLAN}, "give either conversation_id"),
        (
            "create_task",
            {
                "title": "t",
                "conversation_title": "c",
                "steps": [{"title": "x", "tool": "rm.rf"}],
            },
            "step 1: no tool named 'rm.rf'",
        ),
        (
            "create_task",
            {"title": "t\x00", "conversation_title": "c", "steps": PLAN},
            "title contains a character that cannot be stored (NUL or an unpaired surrogate)",
        ),
        (
            "artifact_read",
            {"artifact_id": 1, "view": "html"},
            "bad arguments for artifact_read: view: Input should be 'auto', 'source' or 'preview'",
        ),
        (
            "artifact_store",
            {"task_id": 1, "content": "x", "artifact_class": 9},
            "bad arguments for artifact_store: artifact_class: Input should be less than or equal to 4",
        ),
        ("no_such_tool", {}, "Unknown tool: no_such_tool"),
    ]

    async def scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            answers = [await mcp.call_tool(name, args) for name, args, _ in calls]
            listed = await mcp.list_tools()
            return answers, listed

    answers, listed = run(scenario)
    for (name, _, expected), answer in zip(calls, answers, strict=True):
        text = error(answer)
        assert text.startswith(expected), (name, text)
        assert "Traceback" not in text
        assert "errors.pydantic.dev" not in text
    assert len(listed.tools) == len(TOOLS)
    assert Task.objects.count() == 0


def test_another_users_token_sees_none_of_it(
    mcp_url, token_for, make_user, user, tmp_path
):
    other = make_user(username="mallory")

    async def owner_scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            task = await task_create(mcp, conversation_title="mine")
            step = await call(mcp, "run_next_step", {"task_id": task["id"]})
            council = await call(
                mcp,
                "council_round_start",
                {
                    "conversation_id": task["conversation_id"],
                    "topic": "t",
                    "participants": [{"name": "a"}],
                },
            )
            return task, step["step"]["output"]["id"], council

    task, artifact_id, council = run(owner_scenario)
    before = Event.objects.filter(task_id=task["id"]).count()
    task_id, conversation_id = task["id"], task["conversation_id"]
    probes = [
        ("get_task", {"task_id": task_id}, f"task {task_id} not found (or not yours)"),
        (
            "resume_context",
            {"task_id": task_id},
            f"task {task_id} not found (or not yours)",
        ),
        (
            "run_next_step",
            {"task_id": task_id},
            f"task {task_id} not found (or not yours)",
        ),
        (
            "rewrite_plan",
            {"task_id": task_id, "steps": [{"title": "x", "tool": "test.fetch"}]},
            f"task {task_id} not found (or not yours)",
        ),
        (
            "list_tasks",
            {"conversation_id": conversation_id},
            f"conversation {conversation_id} not found (or not yours)",
        ),
        (
            "artifact_read",
            {"artifact_id": artifact_id},
            f"artifact {artifact_id} not found (or not yours)",
        ),
        (
            "artifact_store",
            {"task_id": task_id, "content": "x", "artifact_class": 3},
            f"task {task_id} not found (or not yours)",
        ),
        ("council_context", {"round_id": council["id"]}, "No such council round."),
        (
            "council_turn_add",
            {
                "round_id": council["id"],
                "participant_id": council["participants"][0]["id"],
                "text": "hi",
            },
            "No such council round.",
        ),
        (
            "create_task",
            {"title": "t", "conversation_id": conversation_id, "steps": PLAN},
            f"conversation {conversation_id} not found (or not yours)",
        ),
    ]

    async def other_scenario():
        async with http_session(mcp_url, token_for(other), name="mallory") as mcp:
            listed = await call(mcp, "list_conversations", {})
            answers = [await mcp.call_tool(name, args) for name, args, _ in probes]
            missing = await mcp.call_tool("get_task", {"task_id": 10**9})
            own = await task_create(mcp, conversation_title="theirs")
            borrowed = await mcp.call_tool(
                "artifact_store",
                {
                    "task_id": own["id"],
                    "content": "derived",
                    "artifact_class": 4,
                    "source_refs": [artifact_id],
                },
            )
            resources = []
            for uri in (f"pippa://task/{task_id}", f"pippa://artifact/{artifact_id}"):
                try:
                    await mcp.read_resource(uri)
                    resources.append("read")
                except Exception as exc:  # noqa: BLE001 - the SDK raises MCPError
                    resources.append(str(exc))
            return listed, answers, missing, borrowed, resources

    listed, answers, missing, borrowed, resources = run(other_scenario)
    assert listed == []
    for (name, _, expected), answer in zip(probes, answers, strict=True):
        assert error(answer) == expected, name
    # Another user's id reads exactly like one that does not exist.
    assert error(missing) == f"task {10**9} not found (or not yours)"
    assert error(borrowed) == f"artifact {artifact_id} not found (or not yours)"
    assert resources == [
        f"task {task_id} not found (or not yours)",
        f"artifact {artifact_id} not found (or not yours)",
    ]
    assert Event.objects.filter(task_id=task_id).count() == before


def test_a_bad_or_missing_token_is_refused_with_401(live_server, mcp_url):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    for headers in ({}, {"Authorization": "Bearer pip_not-a-token"}):
        request = urllib.request.Request(
            mcp_url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                **headers,
            },
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 401
        assert "API token" in json.loads(caught.value.read())["error"]["message"]


def test_a_council_widget_is_read_by_ref_as_image_and_as_source_by_the_next_client(
    mcp_url, token_for, user
):
    token = token_for(user)

    async def first_speaker():
        async with http_session(mcp_url, token, name="claude-code") as mcp:
            task = await task_create(mcp, conversation_title="Council")
            council = await call(
                mcp,
                "council_round_start",
                {
                    "conversation_id": task["conversation_id"],
                    "topic": "Is PIPA cheap?",
                    "participants": [
                        {"name": "Claude", "brain": "claude"},
                        {"name": "Codex", "brain": "codex"},
                    ],
                },
            )
            turn = await call(
                mcp,
                "council_turn_add",
                {
                    "round_id": council["id"],
                    "participant_id": council["participants"][0]["id"],
                    "text": "Here is the chart.",
                    "widget_svg": WIDGET,
                    "widget_title": "PIPA chart",
                },
            )
            return council["id"], turn

    round_id, turn = run(first_speaker)

    async def next_speaker():
        # Given only the round id: everything else comes from the context.
        async with http_session(mcp_url, token, name="codex-cli") as mcp:
            context = await call(mcp, "council_context", {"round_id": round_id})
            (ref,) = context["turns"][0]["artifact_refs"]
            image = await mcp.call_tool(
                "artifact_read",
                {"artifact_id": ref["id"], "view": "preview", "sha256": ref["sha256"]},
            )
            source = await mcp.call_tool(
                "artifact_read",
                {"artifact_id": ref["id"], "view": "source", "sha256": ref["sha256"]},
            )
            wrong = await mcp.call_tool(
                "artifact_read", {"artifact_id": ref["id"], "sha256": "0" * 64}
            )
            return context, ref, image, source, wrong

    context, ref, image, source, wrong = run(next_speaker)
    assert context["for"]["name"] == "Codex"
    assert ref["media_type"] == "image/svg+xml"
    assert ref["artifact_class"] == 4
    assert "<svg" not in json.dumps(context)  # refs, never payloads
    assert not image.is_error
    meta, picture = image.content
    assert picture.type == "image"
    assert picture.mime_type == "image/png"
    assert base64.b64decode(picture.data).startswith(b"\x89PNG\r\n\x1a\n")
    assert json.loads(meta.text)["preview"]["id"] == ref["preview"]["id"]
    assert not source.is_error
    assert source.content[1].text == WIDGET
    assert error(wrong).startswith(f"artifact {ref['id']} has sha256 {ref['sha256']}")
    assert turn["artifact_refs"][0]["id"] == ref["id"]


def test_an_artifact_is_stored_with_class_and_source_refs_and_read_as_a_resource(
    mcp_url, token_for, user
):
    async def scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            task = await task_create(mcp)
            source = await call(
                mcp,
                "artifact_store",
                {
                    "task_id": task["id"],
                    "content": "closes,1,2,3",
                    "artifact_class": 2,
                    "media_type": "text/csv",
                    "title": "closes",
                },
            )
            derived = await call(
                mcp,
                "artifact_store",
                {
                    "task_id": task["id"],
                    "content": base64.b64encode(b"\x89PNG fake").decode(),
                    "encoding": "base64",
                    "artifact_class": 4,
                    "media_type": "application/octet-stream",
                    "source_refs": [source["id"]],
                },
            )
            empty = await mcp.call_tool(
                "artifact_store",
                {"task_id": task["id"], "content": "", "artifact_class": 3},
            )
            read = await mcp.read_resource(f"pippa://artifact/{source['id']}")
            task_doc = await mcp.read_resource(f"pippa://task/{task['id']}")
            return task, source, derived, empty, read, task_doc

    task, source, derived, empty, read, task_doc = run(scenario)
    assert (source["artifact_class"], source["media_type"]) == (2, "text/csv")
    assert derived["source_refs"] == [source["id"]]
    assert Artifact.objects.get(pk=derived["id"]).source_links.count() == 1
    assert error(empty).startswith("content is empty")
    doc = json.loads(read.contents[0].text)
    assert doc["text"] == "closes,1,2,3"
    assert doc["sha256"] == source["sha256"]
    assert json.loads(task_doc.contents[0].text)["id"] == task["id"]
    assert Step.objects.filter(task_id=task["id"]).count() == 3
