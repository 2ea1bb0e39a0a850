"""Token usage: every vendor's counts recorded per brain turn, shown where Dad looks.

The fakes answer with the vendors' own usage objects (OpenAI's ``usage``,
Anthropic's ``usage`` with cached prompt tokens, Gemini's ``usageMetadata``
with thinking tokens), built from the official SDKs' response models. The
expected sums below are read from those answers with the field names the
vendors document, independently of the adapters' own reading.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from api.services import token_create
from brains import brain_make
from brains.base import BrainReply, ToolCall
from brains.runner import LocalBackend, run_brain
from brains.scripted import ScriptedBrain
from tasks.models import Event
from tasks.plan import task_create
from tasks.usage import (
    MAX_CALLS,
    UsageInvalid,
    brain_turn_record,
    conversation_token_usage,
    task_token_usage,
)
from tests.support.fake_vendors import API_KEY, FAKES
from tests.support.plans import CLOSES_CHART_PLAN as PLAN

pytestmark = pytest.mark.django_db(transaction=True)

TURN_KEYS = {
    "brain",
    "model",
    "tool_calls",
    "bad_calls",
    "input_tokens",
    "output_tokens",
    "total_tokens",
}


def vendor_totals(kind: str, answers: list[dict]) -> tuple[int, int, int]:
    """(read, written, total) summed from the vendor's answers as documented."""
    read = written = total = 0
    for answer in answers:
        if kind == "openai":
            u = answer["usage"]
            read += u["prompt_tokens"]
            written += u["completion_tokens"]
            total += u["total_tokens"]
        elif kind == "anthropic":
            u = answer["usage"]
            prompt = (
                u["input_tokens"]
                + (u.get("cache_read_input_tokens") or 0)
                + (u.get("cache_creation_input_tokens") or 0)
            )
            read += prompt
            written += u["output_tokens"]
            total += prompt + u["output_tokens"]
        else:
            u = answer["usageMetadata"]
            read += u["promptTokenCount"]
            written += u["candidatesTokenCount"] + u.get("thoughtsTokenCount", 0)
            total += u["totalTokenCount"]
    return read, written, total


class Bearer:
    def __init__(self, client, user):
        self.client = client
        self.headers = {
            "Authorization": f"Bearer {token_create(user=user, name='t').raw}"
        }

    def get(self, path):
        return self.client.get(path, headers=self.headers)

    def post(self, path, data):
        return self.client.post(
            path, data, content_type="application/json", headers=self.headers
        )


@pytest.fixture(params=["openai", "anthropic", "gemini"])
def vendor_run(request, make_conversation, user):
    kind = request.param
    brain = {"openai": "codex", "anthropic": "claude", "gemini": "gemini"}[kind]
    conversation = make_conversation(owner=user)
    task = task_create(conversation=conversation, title="Closes", steps=PLAN)
    with FAKES[kind]() as fake:
        adapter = brain_make(
            kind=kind,
            brain=brain,
            model=f"{brain}-test-model",
            base_url=fake.base_url,
            api_key=API_KEY,
            timeout=30,
            retries=0,
        )
        report = run_brain(
            brain=adapter, backend=LocalBackend(user=user), task_id=task.pk
        )
    assert fake.errors == []
    return kind, fake, report, task


def test_each_vendors_token_counts_are_recorded_per_turn_and_summed(vendor_run):
    kind, fake, report, task = vendor_run
    read, written, total = vendor_totals(kind, fake.responses)
    turns = list(Event.objects.filter(task=task, kind="brain_turn").order_by("seq"))
    usage = task_token_usage(task=task)
    assert len(turns) == len(fake.responses) == report.turns == 3
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        read,
        written,
        total,
    )
    assert usage.turns == usage.counted_turns == 3
    assert report.total_tokens == total
    assert [t.data["tool_calls"] for t in turns] == [1, 1, 0]
    # The task's counters are the sums of its turn events.
    assert sum(t.data["total_tokens"] for t in turns) == total


def test_a_turn_event_holds_small_metadata_and_never_the_turns_text(vendor_run):
    kind, fake, report, task = vendor_run
    for event in Event.objects.filter(task=task, kind="brain_turn"):
        assert set(event.data) == TURN_KEYS
        assert event.data["model"].endswith("-test-model")
    assert report.final_text
    assert not Event.objects.filter(
        task=task, data__icontains=report.final_text
    ).exists()


def test_the_api_and_mcp_task_documents_carry_the_same_usage(vendor_run, client, user):
    kind, fake, report, task = vendor_run
    expected = task_token_usage(task=task).as_data()
    api = Bearer(client, user)
    doc = api.get(f"/api/v1/tasks/{task.pk}").json()
    conversation_doc = api.get(f"/api/v1/conversations/{task.conversation_id}").json()
    assert doc["usage"] == expected
    assert conversation_doc["usage"] == expected
    assert mcp_get_task(user, task.pk)["usage"] == expected


def test_the_task_page_says_how_many_tokens_the_task_used(vendor_run, dad_client):
    kind, fake, report, task = vendor_run
    total = vendor_totals(kind, fake.responses)[2]
    page = dad_client.get(task.get_absolute_url())
    assert page.status_code == 200
    assert f"This task used <strong>{total:,} tokens</strong>" in page.content.decode()
    assert "over 3 brain turns" in page.content.decode()


def mcp_get_task(user, task_id: int) -> dict:
    """Call MCP's get_task in process, as ``user``."""
    from pippa_mcp.server import acting_as, build_server

    server = build_server()

    async def call():
        with acting_as(user):
            return await server.call_tool("get_task", {"task_id": task_id})

    result = asyncio.run(call())
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def test_the_conversation_page_sums_the_tokens_of_its_tasks(
    make_conversation, user, dad_client
):
    conversation = make_conversation(owner=user)
    first = task_create(conversation=conversation, title="a", steps=PLAN)
    second = task_create(conversation=conversation, title="b", steps=PLAN)
    other = task_create(
        conversation=make_conversation(owner=user), title="c", steps=PLAN
    )
    for task, n in ((first, 1000), (second, 11480), (other, 99)):
        brain_turn_record(
            task=task,
            brain="claude",
            tokens={"input_tokens": n, "output_tokens": 0, "total_tokens": n},
        )
    brain_turn_record(task=second, brain="ollama", tokens=None)
    usage = conversation_token_usage(conversation=conversation)
    page = dad_client.get(conversation.get_absolute_url()).content.decode()
    assert (usage.total_tokens, usage.turns, usage.counted_turns) == (12480, 3, 2)
    assert "This conversation used <strong>12,480 tokens</strong>" in page
    assert "1 of them without counts from the vendor" in page
    assert task_token_usage(task=second).as_data() == {
        "turns": 2,
        "counted_turns": 1,
        "input_tokens": 11480,
        "output_tokens": 0,
        "total_tokens": 11480,
    }


def test_a_task_no_brain_has_answered_shows_no_usage_line(
    make_conversation, user, dad_client
):
    task = task_create(
        conversation=make_conversation(owner=user), title="t", steps=PLAN
    )
    page = dad_client.get(task.get_absolute_url()).content.decode()
    assert page.count('id="token-usage"') == 0
    assert task_token_usage(task=task).turns == 0


def test_a_vendor_that_sends_no_counts_is_counted_in_turns_not_tokens(
    make_conversation, user, dad_client
):
    task = task_create(
        conversation=make_conversation(owner=user), title="t", steps=PLAN
    )
    run_brain(brain=ScriptedBrain(), backend=LocalBackend(user=user), task_id=task.pk)
    usage = task_token_usage(task=task)
    page = dad_client.get(task.get_absolute_url()).content.decode()
    assert (usage.turns, usage.counted_turns, usage.total_tokens) == (3, 0, 0)
    assert (
        "The brain answered 3 times on this task; its vendor sent no token counts"
        in page
    )


@pytest.mark.slow
def test_a_runner_over_the_api_records_its_turns_through_the_api(
    make_conversation, user, live_server
):
    from brains.runner import HttpBackend

    task = task_create(
        conversation=make_conversation(owner=user), title="t", steps=PLAN
    )
    backend = HttpBackend(
        base_url=live_server.url, token=token_create(user=user, name="r").raw
    )
    backend.record_turn(
        task.pk,
        {
            "brain": "kimi",
            "model": "kimi-k2",
            "tool_calls": 2,
            "bad_calls": 1,
            "tokens": {"input_tokens": 1200, "output_tokens": 80},
        },
    )
    event = Event.objects.get(task=task, kind="brain_turn")
    assert event.data == {
        "brain": "kimi",
        "model": "kimi-k2",
        "tool_calls": 2,
        "bad_calls": 1,
        "input_tokens": 1200,
        "output_tokens": 80,
        "total_tokens": 1280,
    }


def test_another_users_task_takes_no_turns_and_shows_no_usage(
    make_conversation, make_user, user, client
):
    stranger = make_user()
    theirs = task_create(
        conversation=make_conversation(owner=stranger), title="t", steps=PLAN
    )
    brain_turn_record(
        task=theirs, brain="claude", tokens={"input_tokens": 5, "output_tokens": 5}
    )
    api = Bearer(client, user)
    turn = {"brain": "claude", "tokens": {"input_tokens": 1, "output_tokens": 1}}
    assert api.post(f"/api/v1/tasks/{theirs.pk}/brain/turns", turn).status_code == 404
    assert api.get(f"/api/v1/tasks/{theirs.pk}").status_code == 404
    assert api.get(f"/api/v1/conversations/{theirs.conversation_id}").status_code == 404
    assert task_token_usage(task=theirs).total_tokens == 10
    from mcp.server.mcpserver.exceptions import ToolError

    with pytest.raises(ToolError, match="not found"):
        mcp_get_task(user, theirs.pk)


@pytest.mark.parametrize(
    "tokens",
    [
        {"input_tokens": -1},
        {"input_tokens": 10**12},
        {"input_tokens": "12"},
        {"input_tokens": 1, "stolen_text": "the whole prompt"},
    ],
    ids=["negative", "absurd", "a-string", "an-unknown-key"],
)
def test_a_turn_with_bad_counts_is_refused_and_nothing_is_recorded(
    tokens, make_conversation, user, client
):
    task = task_create(
        conversation=make_conversation(owner=user), title="t", steps=PLAN
    )
    api = Bearer(client, user)
    response = api.post(
        f"/api/v1/tasks/{task.pk}/brain/turns", {"brain": "claude", "tokens": tokens}
    )
    assert response.status_code == 422, response.content
    assert "tokens" in response.json()["detail"]
    assert not Event.objects.filter(task=task, kind="brain_turn").exists()


def test_a_turn_with_more_calls_than_the_limit_is_refused_by_the_service_and_the_api(
    make_conversation, user, client
):
    task = task_create(
        conversation=make_conversation(owner=user), title="t", steps=PLAN
    )
    api = Bearer(client, user)
    too_many = {"brain": "claude", "tool_calls": MAX_CALLS + 1}

    response = api.post(f"/api/v1/tasks/{task.pk}/brain/turns", too_many)
    with pytest.raises(UsageInvalid, match=f"from 0 to {MAX_CALLS:,}"):
        brain_turn_record(task=task, **too_many)

    assert response.status_code == 422, response.content
    assert "tool_calls" in response.json()["detail"]
    assert not Event.objects.filter(task=task, kind="brain_turn").exists()


def test_a_malformed_call_is_counted_in_the_turns_record(make_conversation, user):
    task = task_create(
        conversation=make_conversation(owner=user), title="t", steps=PLAN
    )
    bad = ToolCall("c1", "run_next_step", {}, error="the arguments are not JSON")
    brain = ScriptedBrain(
        script=[BrainReply(text="", tool_calls=[bad], stop_reason="tool_calls")]
    )
    run_brain(brain=brain, backend=LocalBackend(user=user), task_id=task.pk)
    first = Event.objects.filter(task=task, kind="brain_turn").order_by("seq").first()
    assert (first.data["tool_calls"], first.data["bad_calls"]) == (1, 1)
