"""What every tool promises a client, checked on every registered tool.

The SDK's own client (``mcp.Client``, connected in-process) lists the tools
and calls them: a title and all four hints on each, an input schema that
takes no argument it does not name (and a named refusal for one), an output
schema that every answer is validated against on both ends (the server's
``convert_result`` and the client's ``validate_tool_result``), lists paged,
resources listed and completed for the user only, and no subscription
advertised that could not be kept. The checks walk whatever tools are
registered, so a tool added later meets them too.
"""

from __future__ import annotations

import base64
import json

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import ResourceTemplateReference

from council.services import round_start
from pippa_mcp import resources, server
from pippa_mcp.server import acting_as, invalid_request_id
from tasks.models import Conversation
from tasks.plan import task_create
from tests.pippa_mcp.conftest import PLAN
from tests.support.asyncrun import run_async
from tests.support.executing import crash_at, expire_lease

GENERIC_OUTPUT = {"type": "object", "additionalProperties": True}


def _listed_tools():
    async def scenario():
        async with Client(server.server) as client:
            return (await client.list_tools()).tools

    return run_async(scenario)


def _call_as(user, calls):
    """Call each (tool, args) in order as ``user``; return the results."""

    async def scenario():
        with acting_as(user):
            async with Client(server.server) as client:
                await client.list_tools()  # the client validates answers from here on
                return [await client.call_tool(name, args) for name, args in calls]

    return run_async(scenario)


def _text(result) -> str:
    assert result.is_error, result.structured_content
    (block,) = result.content
    return block.text


# -- what every tool declares --------------------------------------------------------


def test_every_tool_declares_a_title_every_hint_a_closed_input_and_a_typed_output():
    tools = _listed_tools()
    assert tools
    for tool in tools:
        assert tool.title, tool.name
        hints = tool.annotations
        assert hints is not None, tool.name
        assert hints.title == tool.title
        for hint in ("read_only_hint", "destructive_hint", "idempotent_hint"):
            assert isinstance(getattr(hints, hint), bool), (tool.name, hint)
        assert isinstance(hints.open_world_hint, bool), tool.name
        if hints.read_only_hint:
            assert not hints.destructive_hint, tool.name
            assert hints.idempotent_hint, tool.name
        assert tool.input_schema["additionalProperties"] is False, tool.name
        output = tool.output_schema
        assert output, tool.name
        assert output != GENERIC_OUTPUT, tool.name
        assert output.get("type") == "object", tool.name
        assert output.get("properties"), tool.name


def test_every_list_is_paged_with_a_cursor_and_a_limit_and_says_what_it_holds():
    tools = _listed_tools()
    paged = {t.name for t in tools if "next_cursor" in t.output_schema["properties"]}
    assert {t.name for t in tools if t.name.startswith("list_")} <= paged
    assert {"decision_choices", "council_rounds"} <= paged
    for tool in tools:
        if tool.name in paged:
            accepted = tool.input_schema["properties"]
            assert {"cursor", "limit"} <= set(accepted), tool.name
            assert accepted["limit"]["maximum"] == server.MAX_PAGE
            assert "message" in tool.output_schema["properties"], tool.name


def test_every_tool_refuses_an_argument_it_does_not_take_and_names_what_it_takes(user):
    tools = _listed_tools()
    answers = _call_as(user, [(t.name, {"no_such_argument": 1}) for t in tools])
    for tool, answer in zip(tools, answers, strict=True):
        text = _text(answer)
        takes = ", ".join(tool.input_schema["properties"]) or "no arguments"
        assert text.startswith(
            f"{tool.name} does not take the argument 'no_such_argument'; it takes: {takes}"
        ), text


def test_a_misspelled_flag_or_list_is_refused_never_dropped(user):
    create, store = _call_as(
        user,
        [
            (
                "create_task",
                {
                    "title": "t",
                    "conversation_title": "c",
                    "steps": PLAN,
                    "queued": False,
                },
            ),
            (
                "artifact_store",
                {"task_id": 1, "content": "x", "artifact_class": 4, "source_ref": [2]},
            ),
        ],
    )
    assert _text(create).startswith(
        "create_task does not take the argument 'queued'; it takes: title, steps,"
        " conversation_id, conversation_title, brain, queue"
    )
    assert "'source_ref'" in _text(store)
    assert "source_refs" in _text(store)
    assert not Conversation.objects.exists()


# -- every answer in its shape ---------------------------------------------------------


def _waiting_task(owner):
    conversation = Conversation.objects.create(owner=owner, title="Mail")
    task = task_create(
        conversation=conversation,
        title="Send",
        steps=[{"title": "Email", "tool": "test.effect", "args": {}}],
    )
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    return task


@pytest.mark.django_db(transaction=True)
def test_every_tool_answers_in_the_shape_it_declares(user):
    """One successful call of each tool; the SDK checks each answer against
    the tool's output schema on the server and again in the client."""
    waiting = _waiting_task(user)
    step = waiting.steps.get()
    conversation = Conversation.objects.create(owner=user, title="Council")
    council = round_start(
        conversation=conversation, topic="PIPA", participants=[("claude", "claude")]
    )
    speaker = council.participants.get()
    plan = [
        {"title": "Fetch", "tool": "test.fetch", "args": {}},
        {"title": "Fetch again", "tool": "test.fetch", "args": {}},
        # Left to run: pause_task, resume_task and cancel_task act on the task.
        {"title": "Fetch a third time", "tool": "test.fetch", "args": {}},
    ]
    made = _call_as(
        user,
        [("create_task", {"title": "t", "conversation_title": "c", "steps": plan})],
    )[0]
    task = made.structured_content
    stored = _call_as(
        user,
        [
            (
                "artifact_store",
                {"task_id": task["id"], "content": "hi", "artifact_class": 3},
            )
        ],
    )[0].structured_content
    examples = {
        "list_conversations": {"limit": 1},
        "list_tasks": {"conversation_id": task["conversation_id"]},
        "list_step_tools": {},
        "create_task": {
            "title": "u",
            "conversation_id": conversation.pk,
            "steps": plan,
        },
        "get_task": {"task_id": task["id"]},
        "rewrite_plan": {
            "task_id": task["id"],
            "steps": [{"id": s["id"]} for s in task["steps"]],
        },
        "resume_context": {"task_id": task["id"]},
        "read_steps": {"task_id": task["id"], "limit": 1},
        "write_note": {"task_id": task["id"], "text": "Fetch twice."},
        "run_next_step": {"task_id": task["id"]},
        "complete_step": {
            "task_id": task["id"],
            "step_id": task["steps"][1]["id"],
            "content": "what I fetched myself",
        },
        "pause_task": {"task_id": task["id"]},
        "resume_task": {"task_id": task["id"]},
        "decision_choices": {"task_id": waiting.pk},
        "decide_step": {"task_id": waiting.pk, "step_id": step.pk, "action": "fail"},
        "cancel_task": {"task_id": task["id"]},
        "artifact_read": {"artifact_id": stored["id"]},
        "artifact_store": {"task_id": task["id"], "content": "x", "artifact_class": 2},
        "council_round_start": {
            "conversation_id": conversation.pk,
            "topic": "more",
            "participants": [{"name": "codex", "brain": "codex"}],
        },
        "council_rounds": {"conversation_id": conversation.pk},
        "council_context": {"round_id": council.pk},
        "council_turn_add": {
            "round_id": council.pk,
            "participant_id": speaker.pk,
            "text": "hello",
        },
        # The speaker just had the last word (the calls run in this order).
        "council_round_conclude": {
            "round_id": council.pk,
            "participant_id": speaker.pk,
            "outcome": "Hello it is.",
        },
    }
    # A tool without an example here is a tool this test cannot vouch for.
    assert set(examples) == {t.name for t in _listed_tools()}
    answers = _call_as(user, list(examples.items()))
    for name, answer in zip(examples, answers, strict=True):
        assert not answer.is_error, (name, answer.content)
        assert answer.structured_content, name
        # The first content block is the answer as JSON, for clients that read text.
        assert json.loads(answer.content[0].text) == answer.structured_content, name


def test_an_empty_list_says_so_in_words(user):
    (conversations,) = _call_as(user, [("list_conversations", {})])
    assert conversations.structured_content["conversations"] == []
    message = conversations.structured_content["message"]
    assert message.startswith("You have no conversations yet")
    assert message in conversations.content[0].text


# -- resources ---------------------------------------------------------------------------


def _resources_as(user, *, cursor=None, pages=False):
    async def scenario():
        with acting_as(user):
            # Framed as JSON-RPC (the legacy handshake in-process), so an error
            # reaches the client as it would over a transport.
            async with Client(server.server, mode="legacy") as client:
                try:
                    listed = await client.list_resources(cursor=cursor)
                except MCPError as exc:
                    return exc
                out = [listed]
                while pages and listed.next_cursor:
                    listed = await client.list_resources(cursor=listed.next_cursor)
                    out.append(listed)
                return out

    return run_async(scenario)


@pytest.mark.django_db(transaction=True)
def test_resources_list_the_users_tasks_conversations_and_artifacts_page_by_page(
    user, make_user, make_artifact, settings
):
    conversation = Conversation.objects.create(owner=user, title="PIPA")
    tasks = [
        task_create(conversation=conversation, title=f"T{i}", steps=PLAN)
        for i in range(3)
    ]
    artifact = make_artifact(owner=user, title="notes")
    theirs = Conversation.objects.create(owner=make_user(username="mallory"), title="M")
    task_create(conversation=theirs, title="Not yours", steps=PLAN)
    server_page = resources.PAGE_ROWS
    resources.PAGE_ROWS = 2
    try:
        pages = _resources_as(user, pages=True)
    finally:
        resources.PAGE_ROWS = server_page

    listed = [r for page in pages for r in page.resources]
    assert [r.uri for r in listed] == [
        f"pippa://task/{tasks[2].pk}",
        f"pippa://task/{tasks[1].pk}",
        f"pippa://task/{tasks[0].pk}",
        f"pippa://conversation/{conversation.pk}",
        f"pippa://artifact/{artifact.pk}",
    ]
    assert all(len(page.resources) <= 2 for page in pages)
    assert pages[-1].next_cursor is None
    first = listed[0]
    assert first.title == "T2"
    assert first.description.startswith("task: queued, 0 of 3 steps done")
    assert first.mime_type == "application/json"


def test_a_cursor_resources_list_did_not_give_is_an_invalid_parameter(user):
    for cursor in ("nonsense", base64.urlsafe_b64encode(b'["list_tasks", 3]').decode()):
        refused = _resources_as(user, cursor=cursor)
        assert isinstance(refused, MCPError)
        assert refused.error.code == -32602
        assert "is not one resources/list gave out" in refused.error.message


@pytest.mark.django_db(transaction=True)
def test_a_template_id_completes_with_the_users_own_ids_only(user, make_user):
    mine = Conversation.objects.create(owner=user, title="mine")
    ids = [task_create(conversation=mine, title="t", steps=PLAN).pk for _ in range(2)]
    theirs = Conversation.objects.create(owner=make_user(username="mallory"), title="x")
    other = task_create(conversation=theirs, title="x", steps=PLAN)

    async def scenario():
        with acting_as(user):
            async with Client(server.server) as client:
                ref = ResourceTemplateReference(uri="pippa://task/{task_id}")
                every = await client.complete(ref, {"name": "task_id", "value": ""})
                typed = await client.complete(
                    ref, {"name": "task_id", "value": str(ids[0])[:1]}
                )
                words = await client.complete(ref, {"name": "task_id", "value": "x"})
                return every.completion, typed.completion, words.completion

    every, typed, words = run_async(scenario)
    assert every.values == [str(i) for i in reversed(ids)]
    assert str(other.pk) not in every.values
    assert every.has_more is False
    assert all(v.startswith(str(ids[0])[:1]) for v in typed.values)
    assert words.values == []


def test_no_subscription_is_advertised_that_the_server_could_not_keep():
    async def scenario():
        async with Client(server.server) as client:
            return client.server_capabilities

    capabilities = run_async(scenario)
    assert capabilities.resources is not None
    assert not capabilities.resources.subscribe
    assert not capabilities.resources.list_changed
    assert capabilities.completions is not None
    lowlevel = server.server._lowlevel_server
    assert lowlevel.get_request_handler("subscriptions/listen") is None
    assert lowlevel.get_request_handler("resources/subscribe") is None


# -- JSON-RPC ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', "null"),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', "1.5"),
        (b'{"jsonrpc":"2.0","id":NaN,"method":"tools/list"}', "NaN"),
        (b'{"jsonrpc":"2.0","id":true,"method":"tools/list"}', "true"),
        (b'{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}', '{"a": 1}'),
    ],
)
def test_a_request_id_json_rpc_does_not_allow_is_named(body, shown):
    assert invalid_request_id(body) == (
        "Invalid Request: a request's id must be a string or an integer (not null),"
        f" not {shown}"
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":"a","method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":7.0,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b"not json",
    ],
)
def test_a_request_id_json_rpc_allows_passes(body):
    assert invalid_request_id(body) is None
