"""Each adapter speaks its vendor's wire format to a loopback fake of that vendor.

The fakes judge every request with the vendor's official SDK types and answer
with the SDK's response models (``tests.support.fake_vendors``).
"""

from __future__ import annotations

import pytest

from brains import brain_make
from brains.base import BrainError, Message, TokenUsage, ToolCall
from brains.runner import SYSTEM_PROMPT, TOOL_SPECS
from tests.support.fake_vendors import (
    API_KEY,
    FakeAnthropic,
    FakeGemini,
    FakeOpenAI,
    Fault,
)

VENDORS = [
    ("openai", "codex", FakeOpenAI),
    ("openai", "kimi", FakeOpenAI),
    ("openai", "ollama", FakeOpenAI),
    ("anthropic", "claude", FakeAnthropic),
    ("gemini", "gemini", FakeGemini),
]
IDS = [f"{kind}-{brain}" for kind, brain, _ in VENDORS]


def make(kind, brain, fake, **kwargs):
    kwargs.setdefault("timeout", 5)
    kwargs.setdefault("retries", 2)
    kwargs.setdefault("backoff", 0.01)
    return brain_make(
        kind=kind,
        brain=brain,
        model="test-model",
        base_url=fake.base_url,
        api_key=kwargs.pop("api_key", API_KEY),
        **kwargs,
    )


def waiting_adapter(kind, brain, fake, **kwargs):
    """An adapter whose client records its waits instead of sleeping them."""
    adapter = make(kind, brain, fake, **kwargs)
    waits = []
    adapter.http.sleep = waits.append
    return adapter, waits


def opening():
    return [Message(role="user", text="Task 1. Resume context: {}")]


@pytest.fixture(params=VENDORS, ids=IDS)
def vendor(request):
    kind, brain, fake_cls = request.param
    with fake_cls() as fake:
        yield kind, brain, fake


def test_a_first_turn_comes_back_as_a_run_next_step_tool_call(vendor):
    kind, brain, fake = vendor
    adapter = make(kind, brain, fake)
    reply = adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert [c.name for c in reply.tool_calls] == ["run_next_step"]
    assert reply.tool_calls[0].arguments == {}
    assert reply.tool_calls[0].id
    assert adapter.name == brain
    assert fake.errors == []
    sent = fake.requests[0]
    assert sorted(fake.tool_names(sent.body)) == sorted(t.name for t in TOOL_SPECS)


def test_tool_results_go_back_answering_the_calls_that_asked_for_them(vendor):
    kind, brain, fake = vendor
    adapter = make(kind, brain, fake)
    first = adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    call = first.tool_calls[0]
    result = {
        "ran": True,
        "step": {"position": 1, "status": "done", "output": {"id": 7}},
        "task": {"status": "done", "steps_done": 1, "steps_total": 1},
    }
    messages = [
        *opening(),
        first.as_message(),
        Message(role="tool", tool_call_id=call.id, tool_name=call.name, result=result),
    ]
    second = adapter.complete(system=SYSTEM_PROMPT, messages=messages, tools=TOOL_SPECS)
    assert fake.errors == []
    assert second.tool_calls == []
    assert "done" in second.text
    assert fake.tool_results(fake.requests[1].body) == [("run_next_step", result)]


def test_arguments_of_a_tool_call_reach_the_runner_as_a_dict(vendor):
    from tests.support.fake_vendors import Move

    kind, brain, fake = vendor
    fake.script = [Move(calls=[("read_artifact", {"artifact_id": 42})])]
    reply = make(kind, brain, fake).complete(
        system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS
    )
    assert reply.tool_calls[0].name == "read_artifact"
    assert reply.tool_calls[0].arguments == {"artifact_id": 42}


def test_a_rate_limit_is_retried_and_then_answered(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(status=429, message="slow down")]
    reply = make(kind, brain, fake).complete(
        system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS
    )
    assert reply.tool_calls[0].name == "run_next_step"
    assert len(fake.requests) == 2


def test_a_rate_limit_waits_as_long_as_its_retry_after_header_asks(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(status=429, message="slow down", retry_after="3")]
    adapter, waits = waiting_adapter(kind, brain, fake)
    reply = adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert reply.tool_calls[0].name == "run_next_step"
    assert waits == [3.0]
    assert len(fake.requests) == 2


def test_a_retry_after_longer_than_the_limit_is_reported_not_waited_for(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(status=429, message="quota spent", retry_after="3600")]
    adapter, waits = waiting_adapter(kind, brain, fake)
    with pytest.raises(BrainError, match="retry after 3600s") as info:
        adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert "quota spent" in str(info.value)
    assert info.value.status == 429
    assert info.value.retry_after == 3600
    assert waits == []
    assert len(fake.requests) == 1


def test_a_server_error_without_retry_after_backs_off_exponentially(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(status=503), Fault(status=502)]
    adapter, waits = waiting_adapter(kind, brain, fake, backoff=0.25)
    reply = adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert reply.tool_calls[0].name == "run_next_step"
    assert waits == [0.25, 0.5]


def test_a_server_error_that_persists_fails_with_the_vendors_own_message(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(status=503, message="model overloaded")] * 3
    adapter = make(kind, brain, fake, retries=2)
    with pytest.raises(BrainError, match="HTTP 503: model overloaded") as info:
        adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert info.value.status == 503
    assert len(fake.requests) == 3


def test_a_bad_request_is_not_retried(vendor):
    kind, brain, fake = vendor
    adapter = make(kind, brain, fake, api_key="wrong-key")
    with pytest.raises(BrainError, match="HTTP 400") as info:
        adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert info.value.retryable is False
    assert len(fake.requests) == 1


def test_a_vendor_that_does_not_answer_in_time_gives_a_clear_timeout(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(delay=1.0), Fault(delay=1.0)]
    adapter = make(kind, brain, fake, timeout=0.2, retries=1)
    with pytest.raises(
        BrainError, match=r"no answer within 0.2s \(2 attempts\)"
    ) as info:
        adapter.complete(system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS)
    assert info.value.kind == "timeout"


def test_an_answer_that_is_not_json_is_a_clear_error(vendor):
    kind, brain, fake = vendor
    fake.faults = [Fault(garbage=True)]
    with pytest.raises(BrainError, match="not JSON"):
        make(kind, brain, fake).complete(
            system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS
        )


def test_a_vendor_that_is_not_listening_gives_a_connection_error():
    with FakeOpenAI() as fake:
        url = fake.base_url
    adapter = brain_make(
        kind="openai", model="m", base_url=url, api_key=API_KEY, retries=0
    )
    with pytest.raises(BrainError, match="cannot connect") as info:
        adapter.complete(system="s", messages=opening(), tools=TOOL_SPECS)
    assert info.value.kind == "connect"


def test_openai_tool_arguments_that_are_not_json_come_back_as_a_call_with_an_error():
    from brains.openai_compat import OpenAICompatBrain

    adapter = OpenAICompatBrain(model="m", base_url="http://127.0.0.1:9")
    data = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "run_next_step", "arguments": "{oops"},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "read_artifact", "arguments": "[1]"},
                        },
                        {
                            "id": "c3",
                            "type": "function",
                            "function": {"arguments": "{}"},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 900, "completion_tokens": 12, "total_tokens": 912},
    }
    reply = adapter.parse_reply(data)
    assert [c.error for c in reply.tool_calls] == [
        "the arguments of run_next_step are not JSON (Expecting property name "
        'enclosed in double quotes): "{oops"',
        "the arguments of read_artifact must be a JSON object, not a list",
        "the tool call names no tool",
    ]
    assert all(c.arguments == {} for c in reply.tool_calls)
    assert reply.tokens == TokenUsage(900, 12, 912)
    assert reply.text == ""


@pytest.mark.parametrize(
    ("kind", "usage", "expected"),
    [
        (
            "openai",
            {"usage": {"prompt_tokens": 100, "completion_tokens": 20}},
            TokenUsage(100, 20, 120),
        ),
        (
            "anthropic",
            {
                "usage": {
                    "input_tokens": 10,
                    "cache_creation_input_tokens": 200,
                    "cache_read_input_tokens": 3000,
                    "output_tokens": 45,
                }
            },
            TokenUsage(3210, 45, 3255),
        ),
        (
            "gemini",
            {
                "usageMetadata": {
                    "promptTokenCount": 500,
                    "toolUsePromptTokenCount": 7,
                    "candidatesTokenCount": 30,
                    "thoughtsTokenCount": 90,
                    "totalTokenCount": 627,
                }
            },
            TokenUsage(507, 120, 627),
        ),
        (
            "openai",
            {"usage": {"prompt_tokens": "lots", "total_tokens": -3}},
            TokenUsage(0, 0, 0),
        ),
        ("anthropic", {}, None),
    ],
    ids=["openai", "anthropic-cached", "gemini-thinking", "openai-garbage", "none"],
)
def test_each_vendors_usage_is_read_into_one_shape(kind, usage, expected):
    bodies = {
        "openai": {"choices": [{"message": {"content": "hi"}}]},
        "anthropic": {"content": [{"type": "text", "text": "hi"}]},
        "gemini": {"candidates": [{"content": {"parts": [{"text": "hi"}]}}]},
    }
    adapter = brain_make(kind=kind, model="m", base_url="http://127.0.0.1:9")
    reply = adapter.parse_reply({**bodies[kind], **usage})
    assert reply.tokens == expected
    assert reply.text == "hi"


def test_anthropic_tool_results_of_one_turn_share_one_user_message():
    from brains.anthropic import AnthropicBrain

    calls = [
        ToolCall("t1", "read_artifact", {"artifact_id": 1}),
        ToolCall("t2", "read_artifact", {"artifact_id": 2}),
    ]
    messages = [
        *opening(),
        Message(role="assistant", tool_calls=calls),
        Message(
            role="tool", tool_call_id="t1", tool_name="read_artifact", result={"id": 1}
        ),
        Message(
            role="tool", tool_call_id="t2", tool_name="read_artifact", result={"id": 2}
        ),
    ]
    body = AnthropicBrain(model="m", api_key="k").request_body(
        system="s", messages=messages, tools=TOOL_SPECS
    )
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["tool_use_id"] for b in body["messages"][2]["content"]] == ["t1", "t2"]


def test_gemini_declares_tools_as_json_schema_and_argument_free_tools_without_one():
    from brains.gemini import GeminiBrain

    body = GeminiBrain(model="m", api_key="k").request_body(
        system="s", messages=opening(), tools=TOOL_SPECS
    )
    decls = {d["name"]: d for d in body["tools"][0]["functionDeclarations"]}
    assert "parametersJsonSchema" not in decls["run_next_step"]
    assert decls["read_artifact"]["parametersJsonSchema"]["required"] == ["artifact_id"]
    # The OpenAPI-subset field refuses free-form objects such as a step's args.
    assert all("parameters" not in d for d in decls.values())


def test_anthropic_sends_the_configured_api_version(settings):
    settings.PIPPA_ANTHROPIC_VERSION = "2023-06-01"
    with FakeAnthropic() as fake:
        make("anthropic", "claude", fake).complete(
            system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS
        )
    assert fake.requests[0].headers["anthropic-version"] == "2023-06-01"
    assert fake.errors == []


def test_anthropic_by_default_sends_a_current_api_version(settings):
    with FakeAnthropic() as fake:
        make("anthropic", "claude", fake).complete(
            system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS
        )
    assert fake.requests[0].headers["anthropic-version"] == "2026-10-21"
    assert settings.PIPPA_ANTHROPIC_VERSION == "2026-10-21"
    assert fake.errors == []


def test_an_anthropic_version_the_api_does_not_know_is_refused(settings):
    settings.PIPPA_ANTHROPIC_VERSION = "2099-01-01"
    with FakeAnthropic() as fake, pytest.raises(BrainError, match="anthropic-version"):
        make("anthropic", "claude", fake).complete(
            system=SYSTEM_PROMPT, messages=opening(), tools=TOOL_SPECS
        )


def test_the_scripted_brain_runs_steps_until_the_task_settles():
    from brains.scripted import ScriptedBrain

    brain = ScriptedBrain()
    first = brain.complete(system="s", messages=opening(), tools=TOOL_SPECS)
    assert first.tool_calls[0].name == "run_next_step"
    done = Message(
        role="tool",
        tool_call_id=first.tool_calls[0].id,
        tool_name="run_next_step",
        result={"ran": True, "task": {"status": "done"}},
    )
    last = brain.complete(
        system="s",
        messages=[
            *opening(),
            Message(role="assistant", tool_calls=first.tool_calls),
            done,
        ],
        tools=TOOL_SPECS,
    )
    assert last.tool_calls == []
    assert "done" in last.text


def test_an_unknown_brain_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown brain kind 'cobol'"):
        brain_make(kind="cobol")


@pytest.mark.parametrize(
    ("kind", "answer"),
    [
        ("openai", {"choices": [{"message": {"tool_calls": "run_next_step"}}]}),
        ("openai", {"choices": [{"message": ["not", "an", "object"]}]}),
        ("anthropic", {"content": ["text"], "stop_reason": "end_turn"}),
        ("gemini", {"candidates": [{"content": {"parts": {"text": "hi"}}}]}),
        ("gemini", {"candidates": [{"content": "hi"}]}),
        ("gemini", {"candidates": ["hi"]}),
    ],
    ids=[
        "openai-calls-a-string",
        "openai-message-a-list",
        "anthropic-blocks-strings",
        "gemini-parts-an-object",
        "gemini-content-a-string",
        "gemini-candidate-a-string",
    ],
)
def test_an_answer_of_the_wrong_shape_is_a_clear_error_not_a_crash(kind, answer):
    adapter = brain_make(kind=kind, model="m", base_url="http://127.0.0.1:9")
    with pytest.raises(BrainError, match="unexpected answer shape"):
        adapter.parse_reply(answer)


def test_retry_after_is_read_as_seconds_milliseconds_or_an_http_date():
    from email.utils import format_datetime

    from django.utils import timezone

    from brains.base import retry_after_seconds

    soon = format_datetime(
        timezone.now() + timezone.timedelta(seconds=600), usegmt=True
    )
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0
    assert 500 < retry_after_seconds({"retry-after": soon}) <= 600
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_a_token_bound_is_sent_only_when_one_is_set():
    from brains.gemini import GeminiBrain
    from brains.openai_compat import OpenAICompatBrain

    def openai(**kw):
        return OpenAICompatBrain(model="m", base_url="http://x", **kw).request_body(
            system="s", messages=opening(), tools=TOOL_SPECS
        )

    def gemini(**kw):
        return GeminiBrain(model="m", api_key="k", **kw).request_body(
            system="s", messages=opening(), tools=TOOL_SPECS
        )

    # Unset: the vendor's own default (OpenAI's reasoning models refuse max_tokens).
    assert "max_tokens" not in openai()
    assert "generationConfig" not in gemini()
    assert openai(max_tokens=300)["max_tokens"] == 300
    assert gemini(max_tokens=300)["generationConfig"] == {"maxOutputTokens": 300}
