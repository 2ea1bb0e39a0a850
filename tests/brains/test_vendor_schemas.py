"""Every request an adapter builds passes the vendor's own SDK types; the easy
mistakes do not (the judge in ``tests.support.vendor_judge`` must refuse them)."""

from __future__ import annotations

import copy

import pytest

from brains.anthropic import AnthropicBrain
from brains.base import BrainError, Message, ToolCall
from brains.gemini import GeminiBrain
from brains.openai_compat import OpenAICompatBrain
from brains.runner import SYSTEM_PROMPT, TOOL_SPECS
from tests.support.fake_vendors import API_KEY, FakeGemini, Move, anthropic_versions
from tests.support.vendor_judge import judge_anthropic, judge_gemini, judge_openai

GEMINI_PATH = "/v1beta/models/gemini-test:generateContent"
HEADERS = {
    "authorization": f"Bearer {API_KEY}",
    "x-api-key": API_KEY,
    "anthropic-version": "2026-10-21",
    "x-goog-api-key": API_KEY,
}
NESTED_PLAN = {
    "steps": [
        {
            "title": "Fetch closes",
            "tool": "demo.closes",
            "args": {"symbol": "PIPA", "end": "2024-01-31"},
        },
        {"title": "Chart", "tool": "demo.chart", "args": {"source": 1}},
    ]
}


def conversation() -> list[Message]:
    """Text and two calls (nested arguments; bad arguments answered by an error)."""
    calls = [
        ToolCall("call_a", "rewrite_plan", NESTED_PLAN),
        ToolCall("call_b", "read_artifact", {"artifact_id": "seven"}),
    ]
    return [
        Message(role="user", text="Task 1. Resume context: {}"),
        Message(role="assistant", text="Fixing the plan first.", tool_calls=calls),
        Message(
            role="tool",
            tool_call_id="call_a",
            tool_name="rewrite_plan",
            result={"task": {"id": 1, "status": "pending"}, "steps": []},
        ),
        Message(
            role="tool",
            tool_call_id="call_b",
            tool_name="read_artifact",
            result={"error": "artifact_id must be an integer"},
        ),
    ]


def openai_body():
    return OpenAICompatBrain(model="m", base_url="http://127.0.0.1:9").request_body(
        system=SYSTEM_PROMPT, messages=conversation(), tools=TOOL_SPECS
    )


def anthropic_body():
    return AnthropicBrain(model="m", api_key=API_KEY).request_body(
        system=SYSTEM_PROMPT, messages=conversation(), tools=TOOL_SPECS
    )


def gemini_body():
    return GeminiBrain(model="m", api_key=API_KEY).request_body(
        system=SYSTEM_PROMPT, messages=conversation(), tools=TOOL_SPECS
    )


def judged_openai(body):
    return judge_openai(body, HEADERS, api_key=API_KEY)


def judged_anthropic(body):
    return judge_anthropic(
        body, HEADERS, api_key=API_KEY, versions=anthropic_versions()
    )


def judged_gemini(body):
    return judge_gemini(GEMINI_PATH, body, HEADERS, api_key=API_KEY)


# -- what the adapters send passes ---------------------------------------------


def test_the_openai_adapters_request_passes_the_openai_sdk_types():
    body = openai_body()
    assert judged_openai(body) == []
    assert body["messages"][2]["tool_calls"][1]["function"]["arguments"] == (
        '{"artifact_id": "seven"}'
    )


def test_the_anthropic_adapters_request_passes_the_anthropic_sdk_types():
    body = anthropic_body()
    assert judged_anthropic(body) == []
    results = body["messages"][2]["content"]
    assert [b["tool_use_id"] for b in results] == ["call_a", "call_b"]
    assert [b.get("is_error", False) for b in results] == [False, True]


def test_the_gemini_adapters_request_passes_the_google_genai_types():
    body = gemini_body()
    assert judged_gemini(body) == []
    answers = [p["functionResponse"] for p in body["contents"][2]["parts"]]
    assert [a["name"] for a in answers] == ["rewrite_plan", "read_artifact"]
    assert answers[1]["response"] == {"error": "artifact_id must be an integer"}


def test_the_runners_tool_schemas_fit_the_json_schema_gemini_takes():
    from google.genai import types

    from tests.support.vendor_judge import model_problems

    for tool in TOOL_SPECS:
        assert model_problems(types.JSONSchema, tool.parameters, where=tool.name) == []


# -- the easy mistakes are refused -----------------------------------------------


def test_anthropic_refuses_a_tool_result_with_tool_call_id_instead_of_tool_use_id():
    body = anthropic_body()
    block = body["messages"][2]["content"][0]
    block["tool_call_id"] = block.pop("tool_use_id")
    assert any("tool_use_id" in p for p in judged_anthropic(body))


def test_openai_refuses_a_tool_message_with_tool_use_id_instead_of_tool_call_id():
    body = openai_body()
    message = body["messages"][3]
    message["tool_use_id"] = message.pop("tool_call_id")
    assert any("tool_call_id: Field required" in p for p in judged_openai(body))


def test_openai_refuses_an_extra_key_that_its_types_would_silently_drop():
    body = openai_body()
    body["messages"][3]["tool_use_id"] = "call_a"  # beside a correct tool_call_id
    assert judged_openai(body) == ["body.messages[3].tool_use_id: unknown key"]


def test_openai_refuses_tool_call_arguments_sent_as_an_object():
    body = openai_body()
    call = body["messages"][2]["tool_calls"][0]["function"]
    call["arguments"] = NESTED_PLAN
    assert any(
        "arguments: Input should be a valid string" in p for p in judged_openai(body)
    )


def test_openai_refuses_arguments_that_are_a_string_but_not_a_json_object():
    body = openai_body()
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    assert any("JSON object string" in p for p in judged_openai(body))


def test_anthropic_refuses_a_request_without_max_tokens():
    body = anthropic_body()
    del body["max_tokens"]
    assert judged_anthropic(body) == ["body.max_tokens: Field required"]


def test_anthropic_refuses_an_unknown_key_on_a_content_block():
    body = anthropic_body()
    body["messages"][2]["content"][1]["error"] = True  # is_error is the name
    assert judged_anthropic(body) == ["body.messages[2].content[1].error: unknown key"]


def test_anthropic_refuses_tool_calls_left_without_results():
    body = anthropic_body()
    body["messages"][2]["content"].pop()
    assert any("without tool_result" in p for p in judged_anthropic(body))


def test_gemini_refuses_a_function_response_with_result_instead_of_response():
    body = gemini_body()
    answer = body["contents"][2]["parts"][0]["functionResponse"]
    answer["result"] = answer.pop("response")
    assert any(
        "result: Extra inputs are not permitted" in p for p in judged_gemini(body)
    )


def test_gemini_refuses_fewer_function_responses_than_calls():
    body = gemini_body()
    body["contents"][2]["parts"].pop()
    assert any("number of function response parts" in p for p in judged_gemini(body))


@pytest.mark.parametrize(
    ("judged", "body", "where", "role"),
    [
        (judged_openai, openai_body, ("messages", 1), "model"),
        (judged_anthropic, anthropic_body, ("messages", 1), "tool"),
        (judged_gemini, gemini_body, ("contents", 1), "assistant"),
    ],
    ids=["openai-model", "anthropic-tool", "gemini-assistant"],
)
def test_a_role_the_vendor_does_not_take_is_refused(judged, body, where, role):
    request = body()
    key, index = where
    request[key][index]["role"] = role
    assert judged(request)


def test_gemini_refuses_an_openapi_object_without_properties():
    body = gemini_body()
    decl = body["tools"][0]["functionDeclarations"][1]
    decl["parameters"] = decl.pop("parametersJsonSchema")
    problems = judged_gemini(body)
    assert any(
        "items.properties.args: should be non-empty for OBJECT type" in p
        for p in problems
    )


def test_gemini_refuses_both_kinds_of_parameters_at_once():
    body = gemini_body()
    decl = body["tools"][0]["functionDeclarations"][2]
    decl["parameters"] = copy.deepcopy(decl["parametersJsonSchema"])
    assert any("exclude each other" in p for p in judged_gemini(body))


# -- Gemini thought signatures ride through the turn -----------------------------


def signed_answer():
    return {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {
                            "text": "Fixing the plan first.",
                            "thoughtSignature": "c2lnLXQ=",
                        },
                        {
                            "functionCall": {
                                "name": "rewrite_plan",
                                "args": NESTED_PLAN,
                            },
                            "thoughtSignature": "c2lnLWM=",
                        },
                        {
                            "functionCall": {
                                "name": "read_artifact",
                                "args": {"artifact_id": "seven"},
                            }
                        },
                    ],
                },
                "finishReason": "STOP",
            }
        ]
    }


def test_gemini_thought_signatures_go_back_on_the_parts_that_carried_them():
    adapter = GeminiBrain(model="m", api_key=API_KEY)
    reply = adapter.parse_reply(signed_answer())
    assert [c.name for c in reply.tool_calls] == ["rewrite_plan", "read_artifact"]
    messages = [
        Message(role="user", text="go"),
        reply.as_message(),
        *[
            Message(role="tool", tool_call_id=c.id, tool_name=c.name, result={"ok": 1})
            for c in reply.tool_calls
        ],
    ]
    body = adapter.request_body(system="s", messages=messages, tools=TOOL_SPECS)
    assert body["contents"][1] == signed_answer()["candidates"][0]["content"]
    assert judged_gemini(body) == []


def test_a_signing_gemini_refuses_a_second_request_that_dropped_its_signatures():
    adapter_kwargs = {"model": "m", "api_key": API_KEY, "retries": 0}
    with FakeGemini(script=[Move(calls=[("run_next_step", {})])]) as fake:
        adapter = GeminiBrain(base_url=fake.root, **adapter_kwargs)
        first = adapter.complete(system="s", messages=conversation()[:1], tools=[])
        call = first.tool_calls[0]
        stripped = Message(role="assistant", tool_calls=first.tool_calls)
        answer = Message(
            role="tool",
            tool_call_id=call.id,
            tool_name=call.name,
            result={"ran": False, "task": {"status": "done"}},
        )
        with pytest.raises(BrainError, match="HTTP 400: Function call is missing"):
            adapter.complete(
                system="s", messages=[conversation()[0], stripped, answer], tools=[]
            )
        kept = adapter.complete(
            system="s",
            messages=[conversation()[0], first.as_message(), answer],
            tools=[],
        )
    assert kept.tool_calls == []
    assert len(fake.errors) == 1


def test_a_token_bound_passes_the_vendors_request_types():
    bounded = {"max_tokens": 256}
    openai = OpenAICompatBrain(model="m", base_url="http://127.0.0.1:9", **bounded)
    gemini = GeminiBrain(model="m", api_key=API_KEY, **bounded)
    args = {"system": SYSTEM_PROMPT, "messages": conversation(), "tools": TOOL_SPECS}
    assert judged_openai(openai.request_body(**args)) == []
    assert judged_gemini(gemini.request_body(**args)) == []
