"""A three-turn run per vendor, judged by the vendor's official SDK.

Turn 1: text and two tool calls: a plan rewrite with nested arguments, and a
read with bad arguments that the runner answers with an error result.
Turn 2: run the next step. Turn 3: final text. Every answer is built from the
SDK's response models; every request passes the SDK's request types (the
fake answers 400 otherwise, and the run would stop with a BrainError).
"""

from __future__ import annotations

import json

import pytest

from brains import brain_make
from brains.runner import LocalBackend, run_brain
from tasks.models import Step
from tasks.plan import task_create
from tests.support.fake_vendors import API_KEY, FAKES, Move

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = [
    {"title": "Fetch closes", "tool": "demo.closes", "args": {"end": "2024-01-31"}},
    {"title": "Chart them", "tool": "demo.chart", "args": {"source": 1}},
]
REWRITE = {
    "steps": [
        {
            "title": "Fetch PIPA closes for January",
            "tool": "demo.closes",
            "args": {"symbol": "PIPA", "start": "2024-01-02", "end": "2024-01-31"},
        },
        {
            "title": "Chart January",
            "tool": "demo.chart",
            "args": {"source": 1, "title": "PIPA, January"},
        },
    ]
}
FINAL = "Step 1 is saved; the chart comes next."
SCRIPT = [
    Move(
        text="The plan needs a narrower range first.",
        calls=[
            ("rewrite_plan", REWRITE),
            ("read_artifact", {"artifact_id": "the closes"}),
        ],
    ),
    Move(calls=[("run_next_step", {})]),
    Move(text=FINAL),
]
VENDORS = [
    ("openai", "codex", {}),
    ("anthropic", "claude", {}),
    ("gemini", "gemini", {}),
    ("gemini", "gemini", {"call_ids": True}),
]
IDS = ["openai", "anthropic", "gemini-signed", "gemini-signed-with-call-ids"]


def three_turns(kind, brain, options, *, conversation, user):
    task = task_create(conversation=conversation, title="Closes", steps=PLAN)
    fake, report = drive(kind, brain, task, user, script=list(SCRIPT), **options)
    return kind, fake, report, task


def drive(kind, brain, task, user, **options):
    """Run ``task`` with the ``kind`` vendor's fake as ``brain``; return (fake, report)."""
    with FAKES[kind](**options) as fake:
        adapter = brain_make(
            kind=kind,
            brain=brain,
            model=f"{brain}-test-model",
            base_url=fake.base_url,
            api_key=API_KEY,
            # Generous: the fakes judge each request with the vendor's SDK,
            # whose first import is slow on a busy machine.
            timeout=60,
            retries=0,
        )
        report = run_brain(
            brain=adapter, backend=LocalBackend(user=user), task_id=task.pk
        )
    return fake, report


@pytest.fixture(params=VENDORS, ids=IDS)
def run(request, make_conversation, user):
    return three_turns(
        *request.param, conversation=make_conversation(owner=user), user=user
    )


@pytest.fixture(params=VENDORS[2:], ids=IDS[2:])
def gemini_run(request, make_conversation, user):
    return three_turns(
        *request.param, conversation=make_conversation(owner=user), user=user
    )


def test_three_turns_finish_with_the_final_text_and_every_request_accepted(run):
    kind, fake, report, task = run
    assert fake.errors == []
    assert len(fake.requests) == 3
    assert report.turns == 3
    assert report.final_text == FINAL
    assert report.tool_calls == ["rewrite_plan", "read_artifact", "run_next_step"]


def test_the_nested_plan_rewrite_reaches_the_database_intact(run):
    kind, fake, report, task = run
    steps = list(Step.objects.filter(task=task).order_by("position"))
    assert [(s.title, s.tool, s.args) for s in steps] == [
        (s["title"], s["tool"], s["args"]) for s in REWRITE["steps"]
    ]
    assert [s.status for s in steps] == ["done", "pending"]
    assert report.steps_run == 1


def test_the_bad_call_is_answered_with_an_error_in_the_vendors_own_shape(run):
    kind, fake, report, task = run
    second = fake.requests[1].body
    results = dict(fake.tool_results(second))
    assert "artifact_id must be an integer" in results["read_artifact"]["error"]
    assert [s["title"] for s in results["rewrite_plan"]["steps"]] == [
        s["title"] for s in REWRITE["steps"]
    ]
    if kind == "anthropic":
        blocks = second["messages"][-1]["content"]
        assert [b.get("is_error", False) for b in blocks] == [False, True]
    if kind == "openai":
        answered = [
            m["tool_call_id"] for m in second["messages"] if m["role"] == "tool"
        ]
        asked = [c["id"] for c in second["messages"][-3]["tool_calls"]]
        assert answered == asked


def test_the_step_result_reaches_the_vendor_after_it_is_saved(run):
    kind, fake, report, task = run
    name, result = fake.tool_results(fake.requests[2].body)[-1]
    step = Step.objects.get(task=task, position=1)
    assert name == "run_next_step"
    assert result["step"]["status"] == "done"
    assert result["step"]["output"]["sha256"] == step.output.sha256


def test_gemini_gets_its_signed_turns_back_verbatim(gemini_run):
    kind, fake, report, task = gemini_run
    assert fake.errors == []
    for answer, later in zip(fake.responses[:2], fake.requests[1:], strict=True):
        issued = answer["candidates"][0]["content"]
        signatures = [
            p["thoughtSignature"] for p in issued["parts"] if "thoughtSignature" in p
        ]
        assert signatures  # the fake model signs, as Gemini 3 models do
        assert issued in later.body["contents"]
    turn_one = fake.responses[0]["candidates"][0]["content"]["parts"]
    assert ["text" in p and "thoughtSignature" in p for p in turn_one] == [
        True,
        False,
        False,
    ]
    assert "thoughtSignature" in turn_one[1]  # the first call of the turn
    assert "thoughtSignature" not in turn_one[2]
    assert json.dumps(fake.requests[2].body).count("thoughtSignature") == 3


# -- a run longer than the window ----------------------------------------------------

LONG_PLAN = [
    {"title": f"Search {n}", "tool": "demo.search", "args": {"query": "PIPA"}}
    for n in range(1, 6)
]


@pytest.mark.parametrize(("kind", "brain", "options"), VENDORS, ids=IDS)
def test_a_run_longer_than_the_window_sends_each_vendor_a_valid_request_every_turn(
    kind, brain, options, make_conversation, user
):
    task = task_create(
        conversation=make_conversation(owner=user), title="News", steps=LONG_PLAN
    )
    fake, report = drive(kind, brain, task, user, **options)
    # Six turns: five steps and the closing words; every request passed the SDK.
    assert fake.errors == []
    assert report.turns == 6
    assert report.task_status == "done"
    # The last request: the document and the latest two turns, not all five.
    last = fake.requests[-1].body
    (older, earlier), (latest, result) = fake.tool_results(last)
    assert older == latest == "run_next_step"
    assert set(earlier) == {"earlier", "summary"}  # the older result, a line
    assert result["task"]["steps_done"] == 5  # the call just made, whole
    if kind == "gemini":
        # The turns kept still carry their signatures, as the model gave them.
        for answer in fake.responses[-3:-1]:
            assert answer["candidates"][0]["content"] in last["contents"]
