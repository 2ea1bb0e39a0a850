"""The MCP server over streamable HTTP at /mcp/ of the ASGI application (a real
uvicorn), driven by the SDK's own client; then the door itself, with raw
requests: methods, Host/Origin, body size, throttle, requests per user."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import pytest
from axes.models import AccessAttempt

from artifacts.models import Artifact
from pippa_site.throttle import API_TOKEN_NAME
from tasks.models import Event, Step, Task
from tests.conftest import REPO
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
from tests.support.promptness import assert_answered_promptly

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
    "read_steps",
    "write_note",
    "run_next_step",
    "complete_step",
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
    "council_round_conclude",
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
    assert "at most 4,000 characters" in by_name["resume_context"].description
    assert "page by page" in by_name["read_steps"].description
    assert "did yourself" in by_name["complete_step"].description
    assert "write before show" in by_name["run_next_step"].description
    assert {t.uri_template for t in templates} == {
        "pippa://task/{task_id}",
        "pippa://artifact/{artifact_id}",
        "pippa://conversation/{conversation_id}",
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
    step_id = task["steps"][1]["id"]
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
            "read_steps",
            {"task_id": task_id},
            f"task {task_id} not found (or not yours)",
        ),
        (
            "write_note",
            {"task_id": task_id, "text": "mine"},
            f"task {task_id} not found (or not yours)",
        ),
        (
            "complete_step",
            {"task_id": task_id, "step_id": step_id, "content": "done by me"},
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
            "council_round_conclude",
            {
                "round_id": council["id"],
                "participant_id": council["participants"][0]["id"],
                "outcome": "mine now",
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
    assert listed["conversations"] == []
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


def test_an_agent_records_the_steps_it_did_itself_and_reads_the_rest_page_by_page(
    mcp_url, token_for, user, tool_log
):
    async def scenario():
        async with http_session(mcp_url, token_for(user), name="claude-code") as mcp:
            task = await task_create(mcp)
            first, second, third = (s["id"] for s in task["steps"])
            done = await call(
                mcp,
                "complete_step",
                {
                    "task_id": task["id"],
                    "step_id": first,
                    "content": "closes I fetched: 1, 2, 3",
                    "media_type": "text/csv",
                    "worker": "claude-laptop",
                },
            )
            again = await call(
                mcp,
                "complete_step",
                {
                    "task_id": task["id"],
                    "step_id": first,
                    "content": "closes I fetched: 1, 2, 3",
                    "media_type": "text/csv",
                },
            )
            changed = await mcp.call_tool(
                "complete_step",
                {"task_id": task["id"], "step_id": first, "content": "other"},
            )
            note = await call(
                mcp,
                "write_note",
                {"task_id": task["id"], "text": "Closes from the broker's CSV."},
            )
            ran = await call(mcp, "run_next_step", {"task_id": task["id"]})
            drawn = await call(
                mcp,
                "complete_step",
                {
                    "task_id": task["id"],
                    "step_id": third,
                    "content": WIDGET,
                    "media_type": "image/svg+xml",
                    "source_refs": [ran["step"]["output"]["id"]],
                },
            )
            context = await call(mcp, "resume_context", {"task_id": task["id"]})
            page = await call(
                mcp, "read_steps", {"task_id": task["id"], "status": "done", "limit": 2}
            )
            rest = await call(
                mcp,
                "read_steps",
                {"task_id": task["id"], "from_position": page["next_from_position"]},
            )
            return (second, done, again, changed, note, drawn, context, page, rest)

    second, done, again, changed, note, drawn, context, page, rest = run(scenario)
    assert (done["completed"], done["already"]) == (True, False)
    assert done["step"]["output"]["artifact_class"] == 2  # the step's own class
    assert done["step"]["output"]["uri"].startswith("pippa://artifact/")
    assert done["task"]["steps_done"] == 1
    assert again["already"] is True
    assert again["step"]["output"]["id"] == done["step"]["output"]["id"]
    assert "its output stands" in error(changed)
    # The widget the agent drew is a render of the step before, with its preview.
    assert drawn["task"]["status"] == "done"
    widget = Artifact.objects.get(pk=drawn["step"]["output"]["id"])
    assert widget.artifact_class == 4
    assert list(widget.source_links.values_list("source_id", flat=True)) == [
        Step.objects.get(pk=second).output_id
    ]
    assert context["note"] == note
    assert context["counts"] == {"done": 3}
    assert [s["position"] for s in page["steps"]] == [1, 2]
    assert [s["position"] for s in rest["steps"]] == [3]
    # The agent's work went through the envelope; only step 2 called a tool.
    assert invocations(tool_log) == {second: 1}


# -- the door itself: methods, Host/Origin, body size, throttle, calls per user --

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}


def _post(url: str, body: dict | bytes, **headers) -> tuple[int, dict, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={**HEADERS, **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_get_and_delete_on_the_stateless_server_answer_405_at_once(
    mcp_url, token_for, user
):
    """A TypeScript-SDK client opens GET /mcp/ after initialize: it must not hang."""
    token = token_for(user)
    answers, seconds = [], []
    for method in ("GET", "DELETE"):
        request = urllib.request.Request(
            mcp_url,
            method=method,
            headers={"Accept": "text/event-stream", "Authorization": f"Bearer {token}"},
        )
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
        answers.append((caught.value.code, caught.value.headers["Allow"]))
        seconds.append(time.monotonic() - started)
    assert answers == [(405, "POST"), (405, "POST")]
    assert_answered_promptly(seconds)
    # The POST that follows on the same server is answered as usual.
    status, _, _ = _post(mcp_url, INIT, Authorization=f"Bearer {token}")
    assert status == 200


@pytest.mark.parametrize(
    ("raw_id", "shown"), [(b"null", "null"), (b"1.5", "1.5"), (b"NaN", "NaN")]
)
def test_a_request_with_an_id_json_rpc_does_not_allow_is_answered_not_dropped(
    mcp_url, token_for, user, raw_id, shown
):
    """JSON-RPC: an Invalid Request gets an error with a null id (never a 202
    that drops it, as for a notification); the next request is answered."""
    auth = {"Authorization": f"Bearer {token_for(user)}"}
    body = b'{"jsonrpc":"2.0","id":' + raw_id + b',"method":"tools/list"}'
    status, _, answer = _post(mcp_url, body, **auth)

    assert status == 400
    assert json.loads(answer) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "Invalid Request: a request's id must be a string or an"
            f" integer (not null), not {shown}",
        },
    }
    assert _post(mcp_url, INIT, **auth)[0] == 200


def test_a_foreign_origin_or_host_is_refused_and_the_sites_own_origin_is_not(
    asgi_server, mcp_url, token_for, user, settings
):
    settings.CSRF_TRUSTED_ORIGINS = ["https://pippa.example.org"]
    auth = {"Authorization": f"Bearer {token_for(user)}"}
    own = f"http://127.0.0.1:{asgi_server.port}"

    evil_origin = _post(mcp_url, INIT, Origin="http://evil.example", **auth)
    evil_host = _post(mcp_url, INIT, Host="evil.example", **auth)
    rebound = _post(
        mcp_url, INIT, Host="evil.example:80", Origin="http://evil.example", **auth
    )
    same_site = _post(mcp_url, INIT, Origin=own, **auth)
    trusted = _post(mcp_url, INIT, Origin="https://pippa.example.org", **auth)
    no_origin = _post(mcp_url, INIT, **auth)

    assert (evil_origin[0], evil_origin[2]) == (403, b"Invalid Origin header")
    assert (evil_host[0], evil_host[2]) == (421, b"Invalid Host header")
    assert rebound[0] == 421
    assert [same_site[0], trusted[0], no_origin[0]] == [200, 200, 200]


def test_an_oversized_call_is_answered_413_and_the_session_carries_on(
    mcp_url, token_for, user, settings
):
    settings.PIPPA_MCP_MAX_BODY_BYTES = 64 * 1024

    async def scenario():
        async with http_session(mcp_url, token_for(user)) as mcp:
            task = await task_create(mcp)
            answers = []
            for n in range(4):
                try:
                    await mcp.call_tool(
                        "artifact_store",
                        {
                            "task_id": task["id"],
                            "content": "x" * (200 * 1024 + n),
                            "artifact_class": 2,
                        },
                    )
                    answers.append("stored")
                except Exception as exc:  # noqa: BLE001 - the SDK raises MCPError
                    answers.append(str(exc))
                # The same session, the next call: answered as usual.
                answers.append(
                    (await call(mcp, "get_task", {"task_id": task["id"]}))["id"]
                )
            return task, answers

    task, answers = run(scenario)
    too_large = "request body too large (at most 65536 bytes)"
    assert answers == [too_large, task["id"]] * 4
    assert Artifact.objects.count() == 0


def test_failed_mcp_tokens_are_throttled_with_the_apis_counters(
    mcp_url, token_for, user, settings, client
):
    settings.AXES_FAILURE_LIMIT = 5
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    statuses = [
        _post(mcp_url, listing, Authorization=f"Bearer pip_wrong{i}") for i in range(7)
    ]
    api = client.get(
        "/api/v1/conversations",
        HTTP_AUTHORIZATION="Bearer pip_wrong-api",
        REMOTE_ADDR="127.0.0.1",
    )
    counted = AccessAttempt.objects.filter(username=API_TOKEN_NAME).exists()
    good = _post(mcp_url, INIT, Authorization=f"Bearer {token_for(user)}")

    assert [s for s, _, _ in statuses[:5]] == [401] * 5
    status, headers, body = statuses[6]
    assert status == 429
    assert 0 < int(headers["retry-after"]) <= 15 * 60
    assert "too many failed API token attempts" in json.loads(body)["error"]["message"]
    # One counter per address, whichever door the token came through.
    assert api.status_code == 429
    assert counted
    # A valid token is looked up before the address's lockout.
    assert good[0] == 200


def test_requests_in_flight_are_bounded_per_user_whichever_token_they_use(
    asgi_server, token_for, user, make_user, settings
):
    """A second token does not sidestep the bound; another user is not held by it."""
    from pippa_site.slots import MCP_CALLS

    settings.PIPPA_MCP_CALLS_PER_USER = 2
    first, second = token_for(user), token_for(user)
    stranger = token_for(make_user())

    def hold(token: str) -> socket.socket:
        """A call whose body trickles: it is in flight until the body ends."""
        sock = socket.create_connection(("127.0.0.1", asgi_server.port), timeout=10)
        sock.sendall(
            f"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1:{asgi_server.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n"
            "Content-Length: 1000\r\n\r\n{".encode()
        )
        return sock

    held = [hold(first), hold(second)]
    try:
        # Both held calls are past the token check before the third is sent.
        deadline = time.monotonic() + 30
        while MCP_CALLS.held.get(user.pk, 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        counted = MCP_CALLS.held.get(user.pk, 0)
        third = _post(f"{asgi_server.url}/mcp/", INIT, Authorization=f"Bearer {first}")
        fourth = _post(
            f"{asgi_server.url}/mcp/", INIT, Authorization=f"Bearer {token_for(user)}"
        )
        others = _post(
            f"{asgi_server.url}/mcp/", INIT, Authorization=f"Bearer {stranger}"
        )
    finally:
        answered = []
        for sock in held:
            sock.setblocking(False)
            try:
                answered.append(sock.recv(4096)[:80])
            except BlockingIOError:
                answered.append(b"")
            sock.close()
    assert counted == 2, f"held calls not in flight; the server answered {answered}"
    assert answered == [b"", b""]
    assert (third[0], fourth[0]) == (429, 429)
    assert int(third[1]["retry-after"]) >= 1
    assert (
        "you already have 2 MCP calls in flight"
        in (json.loads(third[2])["error"]["message"])
    )
    assert others[0] == 200
    # The held calls ended with their connections: the user may call again.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        again = _post(f"{asgi_server.url}/mcp/", INIT, Authorization=f"Bearer {first}")
        if again[0] == 200:
            break
        time.sleep(0.05)
    assert again[0] == 200


# -- many calls, some abandoned: nothing left behind ------------------------------

SOAK_CALLS = 2000
SOAK_CONCURRENCY = 6


def _busy_threads() -> list[str]:
    """Threads (other than this one) in the project's or the SDK's code.

    The lease keeper (``tasks.lease``) is one standing thread per process, not
    a request's: it is left out.
    """
    here = threading.get_ident()
    standing = {t.ident for t in threading.enumerate() if t.name == "pippa-lease"}
    busy = []
    for ident, frame in sys._current_frames().items():
        if ident == here or ident in standing:
            continue
        stack = traceback.extract_stack(frame)
        ours = [
            f"{f.filename}:{f.lineno}" for f in stack if _ours_or_the_sdks(f.filename)
        ]
        if ours:
            busy.append(
                f"{ident}: {ours[-1]} ... {stack[-1].filename}:{stack[-1].lineno}"
            )
    return busy


def _ours_or_the_sdks(filename: str) -> bool:
    if "/site-packages/" in filename:
        return "/site-packages/mcp/" in filename
    return filename.startswith(str(REPO)) and "/tests/" not in filename


@pytest.mark.slow
def test_two_thousand_calls_a_tenth_abandoned_leave_nothing_behind_and_login_answers(
    asgi_server, mcp_url, token_for, user, python_exe, subprocess_env, settings
):
    # Three agents of one user, two connections each, and the abandoned calls
    # the server is still finishing: not this test's bound (past the user's
    # bound on calls in flight the server answers 429).
    settings.PIPPA_MCP_CALLS_PER_USER = 10 * SOAK_CONCURRENCY
    tokens = [token_for(user) for _ in range(3)]
    token = tokens[0]

    async def setup():
        async with http_session(mcp_url, token) as mcp:
            return await task_create(mcp)

    task = run(setup)
    login = f"{asgi_server.url}/login/"
    probes: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def probe() -> None:
        # A probe that fails is kept, not lost with its thread: a frozen site
        # shows as a timeout here.
        while not stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(login, timeout=10) as response:
                    response.read()
                    status = response.status
            except OSError as error:
                failures.append(f"{time.monotonic() - started:.1f} s: {error!r}")
                continue
            if status != 200:
                failures.append(f"status {status}")
            probes.append(time.monotonic() - started)
            time.sleep(0.1)

    def soak() -> Counter:
        # The load comes from a process of its own: its client work must not
        # share this interpreter's lock with the server under test.
        done = subprocess.run(
            [
                *(python_exe, "-m", "tests.support.mcp_soak", mcp_url),
                *(str(SOAK_CALLS), str(SOAK_CONCURRENCY), str(task["id"]), *tokens),
            ],
            cwd=REPO,
            env=subprocess_env,
            capture_output=True,
            timeout=600,
            check=True,
        )
        return Counter(json.loads(done.stdout))

    urllib.request.urlopen(login, timeout=10).read()  # a warm page: the idle time
    baseline = len(asgi_server.tasks())
    prober = threading.Thread(target=probe, name="login-probe")
    prober.start()
    try:
        outcomes = soak()
        # And after: the server still answers everyone.
        time.sleep(1.0)
    finally:
        stop.set()
        prober.join(timeout=30)

    assert sum(outcomes.values()) == SOAK_CALLS, outcomes
    assert outcomes["answered"] == SOAK_CALLS * 4 // 5
    assert outcomes["left mid-answer"] + outcomes["left early"] == SOAK_CALLS // 5
    assert failures == []
    assert len(probes) > 10
    assert_answered_promptly(probes)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tasks, busy = asgi_server.tasks(), _busy_threads()
        if len(tasks) <= baseline and not busy:
            break
        time.sleep(0.5)
    assert len(tasks) <= baseline, [t.get_coro() for t in tasks]
    assert busy == []
    status, _, _ = _post(mcp_url, INIT, Authorization=f"Bearer {token}")
    assert status == 200


def test_one_users_step_runs_leave_another_users_calls_prompt(
    mcp_url, token_for, user, make_user, make_conversation, tool_log
):
    """The audit: four run_next_step calls of one user (30 s steps) made another
    user's list_conversations wait 24.1 s, the MCP threads being everyone's.
    A step run now has a thread of its own, and one user runs at most
    PIPPA_STEP_RUNS_PER_USER (2) at once: the other two are refused with the
    reason, and the other user's call answers at once."""
    from tasks.plan import task_create as plan_task_create

    other = make_user()
    conversation = make_conversation(owner=user)
    tasks = [
        plan_task_create(
            conversation=conversation,
            title=f"slow {n}",
            steps=[{"title": "slow", "tool": "test.fetch", "args": {"sleep": 3}}],
        )
        for n in range(4)
    ]
    mine, theirs = token_for(user), token_for(other)

    async def scenario():
        results: dict[int, Any] = {}
        async with (
            http_session(mcp_url, mine) as runner,
            http_session(mcp_url, theirs, name="agent-b") as reader,
        ):

            async def step(task_id: int) -> None:
                results[task_id] = await runner.call_tool(
                    "run_next_step", {"task_id": task_id}
                )

            timings = []
            async with anyio.create_task_group() as group:
                for task in tasks:
                    group.start_soon(step, task.pk)
                await anyio.sleep(0.5)  # the steps are running
                for _ in range(5):
                    started = time.monotonic()
                    await reader.call_tool("list_conversations", {})
                    timings.append(time.monotonic() - started)
        return results, timings

    results, timings = run(scenario)

    assert_answered_promptly(timings)
    ran = [r for r in results.values() if not r.is_error]
    refused = [error(r) for r in results.values() if r.is_error]
    assert len(ran) == 2, refused
    assert (
        refused
        == ["you already have 2 step runs in flight; try again when one ends"] * 2
    )
