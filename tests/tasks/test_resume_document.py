"""The resume document (``pippa.resume/3``): bounded, whole JSON, the same for every brain."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from artifacts.models import Artifact
from artifacts.services import artifact_store
from pippa_site.errors import Invalid
from pippa_site.text import TITLE_MAX
from tasks.demo.tools import demo_search
from tasks.executor import step
from tasks.models import Event, Step, Task, TaskArtifact
from tasks.plan import MAX_ARGS_CHARS, task_create
from tasks.resume_document import (
    EXCERPT_CHARS,
    MAX_CHARS,
    MAX_PAGE_STEPS,
    MIN_CHARS,
    SCHEMA,
    document_text,
    document_words,
    resume_payload,
    steps_read,
)
from tasks.services import NOTE_MAX_CHARS, UploadError, task_note_write
from tasks.tools import ToolContext
from tests.support.executing import crash_at, expire_lease, run_task
from tests.support.plans import DEMO_PLAN

pytestmark = pytest.mark.django_db

SEARCH = {"title": "Search the news", "tool": "demo.search", "args": {"query": "PIPA"}}


def search_payload(tmp_path) -> bytes:
    """A real ``demo.search`` output: what a done step of the demo plan holds."""
    ctx = ToolContext(
        task_id=1,
        step_id=1,
        position=1,
        generation=0,
        attempt=1,
        idempotency_key="k",
        files_root=tmp_path,
    )
    return demo_search(ctx, query="PIPA dividend mill").data


def plan_done_up_to(task: Task, done: int, output: Artifact) -> None:
    """Mark the task's first ``done`` steps done with ``output``, as a run would."""
    now = timezone.now()
    Step.objects.filter(task=task, position__lte=done).update(
        status=Step.Status.DONE, output=output, attempts=1, finished_at=now
    )
    Task.objects.filter(pk=task.pk).update(
        steps_done=done,
        status=Task.Status.DONE if done == task.steps_total else "running",
    )


def size(payload: dict) -> int:
    return len(document_text(payload))


def test_every_plan_from_1_to_200_steps_gives_whole_json_within_4000_characters(
    make_conversation, tmp_path
):
    conversation = make_conversation()
    output = artifact_store(
        owner=conversation.owner,
        data=search_payload(tmp_path),
        media_type="application/json",
        artifact_class=3,
        title="Search: PIPA dividend mill",
    )
    steps = [{**SEARCH, "title": f"Search the news, round {n}"} for n in range(1, 201)]
    task = task_create(conversation=conversation, title="News", steps=steps)
    sizes = {}
    # From 200 steps down to 1, each plan in its fullest state: half of it
    # done (with outputs) behind the next step, the rest ahead of it.
    for length in range(200, 0, -1):
        Step.objects.filter(task=task, position__gt=length).delete()
        Step.objects.filter(task=task).update(status="pending", output=None)
        Task.objects.filter(pk=task.pk).update(steps_total=length, steps_done=0)
        plan_done_up_to(task, length // 2, output)
        # The least a door may ask for, on every tenth plan.
        for max_chars in (MAX_CHARS, MIN_CHARS) if length % 10 == 0 else (MAX_CHARS,):
            text = document_text(resume_payload(task, max_chars=max_chars))
            assert len(text) <= max_chars, (length, max_chars)
            doc = json.loads(text)
            assert doc["schema"] == SCHEMA
            assert doc["earlier_done"] + len(doc["recent"]) == length // 2
            assert doc["later"] + len(doc["next"]) == length - length // 2
            if max_chars == MAX_CHARS:
                sizes[length] = len(text)
                # A plan of the demo's tools needs no size rule at all.
                assert doc["trimmed"] == []
    # Past a few steps it grows only by the digits of ids, positions and counts.
    assert sizes[200] - sizes[10] < 80


def test_a_plan_of_the_largest_fields_is_trimmed_by_rule_and_never_cut(
    make_conversation, tmp_path
):
    conversation = make_conversation()
    # Every field at its limit, in characters JSON writes long (quotes,
    # backslashes, control characters) and ones beyond ASCII.
    title = ('"\\\n' + "Überschrift 📈 ") * (TITLE_MAX // 15)
    title = title[:TITLE_MAX]
    args = {"query": 'ä"' * ((MAX_ARGS_CHARS - 40) // 8)}
    assert len(json.dumps(args)) <= MAX_ARGS_CHARS
    steps = [{"title": title, "tool": "demo.search", "args": args}] * 200
    task = task_create(conversation=conversation, title=title, steps=steps)
    output = artifact_store(
        owner=conversation.owner,
        data=("“" + title).encode() * 20,
        media_type="text/plain",
        artifact_class=3,
        title=title,
    )
    plan_done_up_to(task, 100, output)
    Step.objects.filter(task=task, position=101).update(
        status=Step.Status.FAILED, error='Ä"' * 800
    )
    Task.objects.filter(pk=task.pk).update(lease_owner="w" * 200)
    task_note_write(task=task, text='"\\' * (NOTE_MAX_CHARS // 2))
    for max_chars in (MAX_CHARS, 3000, 2000, MIN_CHARS):
        payload = resume_payload(task, max_chars=max_chars)
        text = document_text(payload)
        assert len(text) <= max_chars
        doc = json.loads(text)
        assert doc["trimmed"]  # it says which rules shortened it
        assert doc["next"][0]["position"] == 101  # the step that needs a person stays
        assert doc["counts"] == {"done": 100, "failed": 1, "pending": 99}
    # The rules shorten fields, each of them still what it was, only shorter.
    whole = resume_payload(task, max_chars=MAX_CHARS)
    assert whole["next"][0]["args"] in (None, args)
    if whole["next"][0]["args"] is None:
        assert whole["next"][0]["args_chars"] == len(
            json.dumps(args, ensure_ascii=False)
        )
    assert title.startswith(whole["task"]["title"].removesuffix("…"))


def test_the_document_shows_next_steps_with_what_resume_will_do_and_that_is_what_happens(
    make_conversation,
):
    task = task_create(conversation=make_conversation(), title="Chart", steps=DEMO_PLAN)
    crash_at(task.pk, "after_payload:3")
    expire_lease(task.pk)
    doc = resume_payload(task)
    assert doc["schema"] == "pippa.resume/3"
    assert doc["task"]["steps_done"] == 2
    assert doc["counts"] == {"done": 2, "running": 1, "pending": 1}
    assert [s["position"] for s in doc["next"]] == [3, 4]
    assert doc["next"][0]["resume"] == {
        "rule": "class3_adopt_snapshot",
        "words": "will reuse the saved search snapshot",
    }
    assert doc["next"][1]["resume"]["rule"] == "run"
    assert doc["next"][0]["idempotency_key"].startswith(f"pippa:{task.pk}:")
    # The finished steps: refs (never the payload) and a short excerpt.
    image, closes = doc["recent"]
    assert (image["output"]["artifact_class"], image["excerpt"]) == (1, None)
    assert closes["excerpt"].startswith("date,close")
    assert len(closes["excerpt"]) <= EXCERPT_CHARS
    assert set(closes["output"]) == {
        "id",
        "sha256",
        "artifact_class",
        "class_label",
        "media_type",
        "size",
        "title",
    }
    assert doc["earlier_done"] == doc["later"] == 0
    outcome = step(task_id=task.pk, worker_id="w")
    assert outcome.rule == "class3_adopt_snapshot"


def test_older_steps_are_counted_and_named_but_not_listed(make_conversation):
    steps = [{**SEARCH, "title": f"Search {n}"} for n in range(1, 13)]
    task = task_create(conversation=make_conversation(), title="News", steps=steps)
    run_task(task.pk)
    doc = resume_payload(task)
    assert [s["position"] for s in doc["recent"]] == [10, 11, 12]
    assert doc["next"] == []
    assert doc["earlier_done"] == 9
    assert (
        "9 earlier finished steps not listed: read them with read_steps"
        in (doc["read_steps"])
    )
    assert "Search 3" not in document_text(doc)


def test_refs_never_payloads_so_the_document_does_not_grow_with_an_output(
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
        doc = resume_payload(task)
        (done,) = doc["recent"]
        assert done["output"]["size"] == size
        assert len(done["excerpt"]) <= EXCERPT_CHARS  # its first characters only
        sizes.append(size_of := len(document_text(doc)))
        assert size_of < 2000
    # Only the excerpt's length (a 100-byte output is shorter than one) and
    # the size's digits differ.
    assert abs(sizes[0] - sizes[1]) < EXCERPT_CHARS


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
        doc = resume_payload(task)
        doc["task"].pop("id")
        doc["task"].pop("brain")
        for s in doc["next"]:
            s.pop("id")
            s.pop("idempotency_key")
        docs.append(doc)
    assert docs[0] == docs[1] == docs[2]


def test_a_document_smaller_than_the_least_or_larger_than_the_most_is_refused(
    make_conversation,
):
    task = task_create(conversation=make_conversation(), title="t", steps=[SEARCH])
    for bad in (MIN_CHARS - 1, MAX_CHARS + 1, 0):
        with pytest.raises(Invalid, match="max_chars must be from"):
            resume_payload(task, max_chars=bad)


# -- the brain's note -------------------------------------------------------------


def test_the_last_note_written_is_in_the_document_and_kept_as_a_class_3_artifact(
    make_conversation,
):
    task = task_create(conversation=make_conversation(), title="t", steps=[SEARCH])
    first = task_note_write(task=task, text="Check the dividend date first.")
    second = task_note_write(task=task, text="Dividend: 14 May. Chart next.")
    note = resume_payload(task)["note"]
    assert note["text"] == "Dividend: 14 May. Chart next."
    assert note["artifact_id"] == second.pk
    assert second.artifact_class == 3
    assert second.media_type == "text/markdown"
    # Both stay with the task (history), named by their events.
    assert TaskArtifact.objects.filter(task=task, role="persisted").count() == 2
    written = Event.objects.filter(task=task, kind="note_written").order_by("seq")
    assert [e.data["artifact_id"] for e in written] == [first.pk, second.pk]
    assert "Dividend" not in json.dumps([e.data for e in written])  # refs, not text


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("   ", "a note needs some text"),
        ("x" * (NOTE_MAX_CHARS + 1), f"a note is at most {NOTE_MAX_CHARS} characters"),
        ("a\x00b", "cannot be stored"),
    ],
)
def test_a_note_that_cannot_be_kept_is_refused_and_nothing_is_written(
    make_conversation, text, error
):
    task = task_create(conversation=make_conversation(), title="t", steps=[SEARCH])
    with pytest.raises(Invalid, match=error):
        task_note_write(task=task, text=text)
    assert not Artifact.objects.exists()
    assert not Event.objects.filter(task=task, kind="note_written").exists()
    assert isinstance(UploadError(""), Invalid)


# -- read_steps ----------------------------------------------------------------------


def test_read_steps_pages_through_a_plan_in_order(make_conversation):
    steps = [{**SEARCH, "title": f"Search {n}"} for n in range(1, 46)]
    task = task_create(conversation=make_conversation(), title="News", steps=steps)
    for _ in range(5):
        step(task_id=task.pk, worker_id="w")
    seen, start = [], 1
    while start is not None:
        page = steps_read(task=task, from_position=start, limit=20)
        assert page.matching == 46 - start
        seen += [s.position for s in page.steps]
        start = page.next_from_position
    assert seen == list(range(1, 46))
    done = steps_read(task=task, status="done")
    assert [s.position for s in done.steps] == [1, 2, 3, 4, 5]
    assert all(s.output is not None for s in done.steps)
    window = steps_read(task=task, from_position=3, to_position=7, status="pending")
    assert [s.position for s in window.steps] == [6, 7]
    assert window.next_from_position is None


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({"from_position": 0}, "positions, 1 or more"),
        ({"from_position": 5, "to_position": 4}, "comes before"),
        ({"status": "finished"}, "status must be one of"),
        ({"limit": MAX_PAGE_STEPS + 1}, "limit must be from 1"),
        ({"limit": 0}, "limit must be from 1"),
    ],
)
def test_read_steps_refuses_what_names_no_steps_with_a_sentence(
    make_conversation, query, error
):
    task = task_create(conversation=make_conversation(), title="t", steps=[SEARCH])
    with pytest.raises(Invalid, match=error):
        steps_read(task=task, **query)


# -- in Dad's words -------------------------------------------------------------------


def test_dad_reads_in_words_what_the_brain_will_be_told(make_conversation):
    steps = [
        {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
        {"title": "Search the news", "tool": "demo.search", "args": {}},
        {"title": "Title card", "tool": "demo.image", "args": {}},
        {"title": "Chart the closes", "tool": "demo.chart", "args": {"source": 1}},
        {"title": "Search again", "tool": "demo.search", "args": {}},
    ]
    task = task_create(conversation=make_conversation(), title="t", steps=steps)
    assert document_words(resume_payload(task)) == (
        "It will be told: no step is done yet; it goes on at step 1, Fetch closes,"
        " then 4 more."
    )
    for _ in range(3):
        step(task_id=task.pk, worker_id="w")
    assert document_words(resume_payload(task)) == (
        "It will be told: steps 1–3 are done (with their results); it goes on at"
        " step 4, Chart the closes, then 1 more."
    )
    run_task(task.pk, worker_id="w")
    task_note_write(task=task, text="All five saved.")
    assert document_words(resume_payload(task)) == (
        "It will be told: steps 1–5 are done (the last 3 with their results, the 2"
        " before on request); there is nothing left to run. It also gets the note"
        " it left: “All five saved.”."
    )
