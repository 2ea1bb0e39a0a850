"""The three ways a real model broke a run, each replayed from the real server.

``tests/brains/fixtures/llama_cpp.json`` holds requests and answers recorded
from llama-cpp-python's OpenAI-compatible server serving SmolLM2-135M-Instruct
(``python -m tests.support.record_llama`` records them again). The slow suite
(``test_local_model.py``) runs the same paths against a live server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brains import brain_make
from brains.runner import SYSTEM_PROMPT, TOOL_SPECS, LocalBackend, run_brain
from tasks.models import Event, Step
from tasks.plan import task_create
from tests.support.fake_vendors import ReplayOpenAI
from tests.support.record_llama import conversation
from tests.support.vendor_judge import judge_openai

RECORDED = json.loads(
    (Path(__file__).parent / "fixtures" / "llama_cpp.json").read_text()
)
DEMO_PLAN = [
    {"title": "Fetch closes", "tool": "demo.closes", "args": {"end": "2024-01-31"}},
    {"title": "Search the news", "tool": "demo.search", "args": {"query": "PIPA"}},
    {"title": "Chart them", "tool": "demo.chart", "args": {"source": 1}},
]


def answer(name: str) -> dict:
    entry = RECORDED[name]
    assert entry["status"] == 200
    return entry["answer"]


def test_the_real_server_refused_a_null_content_turn_and_took_the_one_now_sent():
    refused, accepted = RECORDED["content_null"], RECORDED["content_empty"]
    adapter = brain_make(
        kind="openai",
        brain="ollama",
        model=accepted["request"]["model"],
        base_url="http://127.0.0.1:9/v1",
    )
    sent = adapter.request_body(
        system=SYSTEM_PROMPT, messages=conversation(), tools=TOOL_SPECS
    )
    assert refused["status"] == 500
    assert "content" in refused["answer"]["error"]["message"]
    assert refused["request"]["messages"][2]["content"] is None
    assert accepted["status"] == 200
    assert sent == accepted["request"]
    assert sent["messages"][2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": sent["messages"][2]["tool_calls"],
    }
    # OpenAI's own request types take it too.
    assert judge_openai(sent, {"authorization": "Bearer k"}, api_key="k") == []


def replay_run(answers, *, conversation, user, max_turns):
    task = task_create(conversation=conversation, title="Demo", steps=DEMO_PLAN)
    with ReplayOpenAI(answers) as server:
        adapter = brain_make(
            kind="openai",
            brain="ollama",
            model="SmolLM2-135M-Instruct",
            base_url=server.base_url,
            api_key="test-key-not-secret",
            retries=0,
        )
        report = run_brain(
            brain=adapter,
            backend=LocalBackend(user=user),
            task_id=task.pk,
            max_turns=max_turns,
        )
    return task, server, report


@pytest.mark.django_db(transaction=True)
def test_real_arguments_that_are_not_json_are_answered_and_the_run_goes_on(
    make_conversation, user
):
    cut = answer("arguments_cut")
    raw = cut["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    with pytest.raises(json.JSONDecodeError, match="Expecting|Unterminated|Invalid"):
        json.loads(raw)
    task, server, report = replay_run(
        [cut], conversation=make_conversation(owner=user), user=user, max_turns=3
    )
    assert server.errors == []
    assert len(server.requests) == report.turns == 3
    assert report.stopped_because == "turn limit (3) reached"
    assert report.refused == 3
    results = server.tool_results(server.requests[1].body)
    assert results[0][0] == "rewrite_plan"
    assert results[0][1]["error"].startswith(
        "the arguments of rewrite_plan are not JSON"
    )
    assert '{ \\"steps\\" : [ { \\"title\\": \\"' in results[0][1]["error"]
    # Sent back as the model sent it would not parse either: an empty object goes.
    turn = server.requests[1].body["messages"][2]
    assert turn["content"] == ""
    assert turn["tool_calls"][0]["function"]["arguments"] == "{}"
    assert [s.title for s in task.steps.order_by("position")] == [
        s["title"] for s in DEMO_PLAN
    ]
    bad = Event.objects.filter(task=task, kind="brain_turn").order_by("seq")
    assert [e.data["bad_calls"] for e in bad] == [1, 1, 1]
    assert bad[2].data["total_tokens"] == cut["usage"]["total_tokens"]


@pytest.mark.django_db(transaction=True)
def test_a_real_empty_plan_is_refused_because_a_plan_needs_a_step(
    make_conversation, user
):
    empty = answer("empty_plan")
    arguments = empty["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"steps": []}
    task, server, report = replay_run(
        [empty], conversation=make_conversation(owner=user), user=user, max_turns=2
    )
    name, result = server.tool_results(server.requests[1].body)[0]
    assert name == "rewrite_plan"
    assert result == {"error": "a plan needs at least one step"}
    assert "must be a list" not in json.dumps(server.requests[-1].body)
    assert Step.objects.filter(task=task).count() == 3
    assert report.refused == 2
    assert not Event.objects.filter(task=task, kind="plan_rewritten").exists()


@pytest.mark.django_db(transaction=True)
def test_a_real_run_of_four_turns_replays_without_an_http_error(
    make_conversation, user
):
    answers = [a["answer"] for a in RECORDED["turns"]["answers"]]
    assert all(a["status"] == 200 for a in RECORDED["turns"]["answers"])
    task, server, report = replay_run(
        answers, conversation=make_conversation(owner=user), user=user, max_turns=4
    )
    assert server.errors == []
    assert report.turns == 4
    assert report.total_tokens == sum(a["usage"]["total_tokens"] for a in answers)
    # A 135M model invents tools and writes notes: each call is answered, the
    # invented ones with why.
    results = [server.tool_results(r.body)[-1] for r in server.requests[1:]]
    assert [name for name, _ in results] == report.tool_calls[:3]
    refused = [r["error"] for _, r in results if "error" in r]
    assert refused
    assert all("no tool named" in e or "not JSON" in e for e in refused)
    assert report.refused >= len(refused)
    # Each request: the document now and the latest two turns, no more.
    for request in server.requests:
        roles = [m["role"] for m in request.body["messages"]]
        assert roles[:2] == ["system", "user"]
        assert roles.count("assistant") <= 2
