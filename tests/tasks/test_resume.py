"""What a resumed brain reads: resume_context and resume_advice."""

from __future__ import annotations

import json

import pytest

from tasks.executor import step
from tasks.models import Step
from tasks.plan import task_create
from tasks.resume import resume_advice, resume_context
from tasks.tools import tools_load
from tests.support.executing import crash_at, expire_lease, run_task
from tests.support.plans import DEMO_PLAN


@pytest.fixture(autouse=True)
def _tools():
    tools_load(["tests.support.tools"])


@pytest.mark.django_db
def test_resume_context_lists_the_plan_with_refs_and_what_resume_will_do(
    make_conversation,
):
    task = task_create(conversation=make_conversation(), title="Chart", steps=DEMO_PLAN)
    crash_at(task.pk, "after_payload:3")
    expire_lease(task.pk)
    doc = resume_context(task)
    assert doc["schema"] == "pippa.resume/2"
    assert doc["task"]["steps_done"] == 2
    assert doc["next_step"] == 3
    assert [s["status"] for s in doc["steps"]] == ["done", "done", "running", "pending"]
    image = doc["steps"][0]["output"]
    assert set(image) == {
        "id",
        "sha256",
        "artifact_class",
        "class_label",
        "media_type",
        "size",
        "title",
    }
    assert (image["artifact_class"], image["media_type"]) == (1, "image/png")
    assert doc["steps"][2]["resume"] == {
        "rule": "class3_adopt_snapshot",
        "words": "will reuse the saved search snapshot",
    }
    assert doc["steps"][3]["resume"]["rule"] == "run"
    assert "resume" not in doc["steps"][0]
    # What the document said is what the executor then does.
    outcome = step(task_id=task.pk, worker_id="w")
    assert outcome.rule == "class3_adopt_snapshot"


@pytest.mark.django_db
def test_resume_context_carries_refs_never_payloads_so_its_size_does_not_grow(
    make_conversation,
):
    sizes = []
    for size in (100, 200_000):
        task = task_create(
            conversation=make_conversation(),
            title="big",
            steps=[{"title": "fetch", "tool": "test.fetch", "args": {"size": size}}],
        )
        run_task(task.pk)
        doc = json.dumps(resume_context(task))
        the_step = Step.objects.get(task=task)
        assert f"task {task.pk} step {the_step.pk} gen" not in doc  # payload text
        sizes.append(len(doc))
        assert resume_context(task)["steps"][0]["output"]["size"] == size
    assert abs(sizes[0] - sizes[1]) < 40


@pytest.mark.django_db
def test_every_brain_gets_the_same_document(make_conversation):
    conversation = make_conversation()
    docs = []
    for brain in ("claude", "kimi", "ollama"):
        task = task_create(
            conversation=conversation,
            title="same",
            steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
            brain=brain,
        )
        doc = resume_context(task)
        doc["task"].pop("id")
        doc["task"].pop("brain")
        for s in doc["steps"]:
            s.pop("id")
            s.pop("idempotency_key")
        docs.append(doc)
    assert docs[0] == docs[1] == docs[2]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tool", "boundary", "words"),
    [
        ("test.fetch", "after_payload", "will fetch again"),
        ("test.snapshot", "after_payload", "will reuse the saved snapshot"),
        (
            "test.snapshot",
            "after_tool",
            "will issue the call again: no snapshot was saved, so none was shown",
        ),
        ("test.file", "after_payload", "will reuse the saved file (its sha matches)"),
        ("test.effect", "after_started", "needs you: the tool has outside effects"),
    ],
)
def test_resume_advice_says_in_plain_words_what_resume_will_do(
    make_conversation, tool, boundary, words
):
    task = task_create(
        conversation=make_conversation(),
        title="one",
        steps=[{"title": "one", "tool": tool, "args": {}}],
    )
    crash_at(task.pk, boundary)
    the_step = Step.objects.get(task=task)
    # While the crashed worker's lease is live, the step is shown as running.
    assert resume_advice(the_step).rule == "in_progress"
    expire_lease(task.pk)
    assert resume_advice(Step.objects.get(task=task)).words == words


@pytest.mark.django_db
def test_resume_advice_for_settled_steps(make_conversation):
    task = task_create(
        conversation=make_conversation(),
        title="flaky",
        steps=[
            {
                "title": "flaky",
                "tool": "test.flaky",
                "args": {"fail_times": 9},
                "max_attempts": 1,
            },
            {"title": "later", "tool": "test.fetch", "args": {}},
        ],
    )
    first, later = Step.objects.filter(task=task).order_by("position")
    assert resume_advice(later).words == "will run (attempt 1 of 3)"
    run_task(task.pk)
    first.refresh_from_db()
    assert (
        resume_advice(first).words == "failed after 1 attempt(s): retry it to run again"
    )
