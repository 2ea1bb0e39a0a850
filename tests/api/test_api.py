"""The JSON API: each endpoint, owner checks, and every bad input's 4xx reason."""

from __future__ import annotations

import json

import pytest

from artifacts.models import Artifact, ArtifactSource
from artifacts.store import BlobStore, default_store
from tasks.models import Conversation, Event, Step, Task, TaskArtifact
from tests.api.conftest import first_step_done, new_task, run
from tests.support.plans import CLOSES_CHART_PLAN as PLAN

pytestmark = pytest.mark.django_db(transaction=True)


def table_counts():
    return (
        Conversation.objects.count(),
        Task.objects.count(),
        Step.objects.count(),
        Artifact.objects.count(),
        TaskArtifact.objects.count(),
    )


def test_the_openapi_schema_lists_every_endpoint(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    for path in (
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}/plan",
        "/api/v1/tasks/{task_id}/resume-context",
        "/api/v1/tasks/{task_id}/steps",
        "/api/v1/tasks/{task_id}/steps/run",
        "/api/v1/tasks/{task_id}/steps/{step_id}/complete",
        "/api/v1/tasks/{task_id}/note",
        "/api/v1/tasks/{task_id}/artifacts",
        "/api/v1/artifacts/{artifact_id}/content",
        "/api/v1/council/rounds/{round_id}/context",
    ):
        assert path in schema["paths"]


def test_a_conversation_and_a_task_with_its_plan_are_created_together(api_client):
    task = new_task(api_client, brain="kimi")
    assert [s["title"] for s in task["steps"]] == ["Fetch closes", "Chart them"]
    assert task["brain"] == "kimi"
    assert task["steps"][0]["artifact_class"] == 2
    conversation = Conversation.objects.get(pk=task["conversation_id"])
    assert conversation.owner == api_client.user


def test_a_plan_with_an_unknown_tool_is_refused_and_nothing_is_written(api_client):
    before = table_counts()
    response = api_client.post(
        "/api/v1/tasks",
        {
            "conversation_title": "c",
            "title": "t",
            "steps": [{"title": "x", "tool": "rm.rf", "args": {}}],
        },
    )
    assert response.status_code == 400
    assert "no tool named 'rm.rf'" in response.json()["detail"]
    assert table_counts() == before


def test_an_invalid_brain_name_is_a_422_with_the_field_named(api_client):
    response = api_client.post(
        "/api/v1/tasks",
        {"conversation_title": "c", "title": "t", "steps": PLAN, "brain": "hal9000"},
    )
    assert response.status_code == 422
    assert "brain" in response.json()["detail"]


def test_a_malformed_json_body_is_a_400(api_client):
    response = api_client.client.post(
        "/api/v1/conversations",
        b"{not json",
        content_type="application/json",
        headers=api_client.headers,
    )
    assert response.status_code == 400
    assert "Cannot parse request body" in response.json()["detail"]


def test_an_oversized_json_body_is_a_413(api_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api_client.post("/api/v1/conversations", {"title": "x" * 5000})
    assert response.status_code == 413
    assert "too large" in response.json()["detail"]
    assert not Conversation.objects.exists()


@pytest.mark.parametrize("staff", [False, True], ids=["user", "staff"])
def test_another_users_task_conversation_and_artifact_answer_404(
    make_api_client, make_user, staff
):
    owner = make_api_client()
    # A token acts as its own user: a staff user's token sees no more.
    stranger = make_api_client(make_user(is_staff=staff))
    task = new_task(owner)
    run(owner, task["id"])
    artifact_id = Step.objects.get(task_id=task["id"], position=1).output_id
    for path in (
        f"/api/v1/tasks/{task['id']}",
        f"/api/v1/tasks/{task['id']}/resume-context",
        f"/api/v1/tasks/{task['id']}/steps",
        f"/api/v1/conversations/{task['conversation_id']}",
        f"/api/v1/artifacts/{artifact_id}",
        f"/api/v1/artifacts/{artifact_id}/content",
    ):
        response = stranger.get(path)
        assert response.status_code == 404, path
        assert "not found (or not yours)" in response.json()["detail"]
    assert run(stranger, task["id"]).status_code == 404
    step_id = Step.objects.get(task_id=task["id"], position=2).pk
    for path, body in (
        (
            f"/api/v1/tasks/{task['id']}/steps/{step_id}/complete",
            {"worker": "w", "content": "<svg/>"},
        ),
        (f"/api/v1/tasks/{task['id']}/note", {"text": "mine now"}),
    ):
        response = stranger.post(path, body)
        assert response.status_code == 404, path
    assert Task.objects.get(pk=task["id"]).steps_done == 1
    assert not Event.objects.filter(task_id=task["id"], kind="note_written").exists()


def test_unknown_ids_answer_404_with_the_id(api_client):
    response = api_client.get("/api/v1/tasks/987654")
    assert response.status_code == 404
    assert response.json()["detail"] == "task 987654 not found (or not yours)"


def test_running_a_step_answers_with_its_persisted_output(api_client, blob_store):
    task = new_task(api_client)
    response = run(api_client, task["id"])
    assert response.status_code == 200
    body = response.json()
    assert body["ran"] is True
    assert body["step"]["status"] == "done"
    output = body["step"]["output"]
    artifact = Artifact.objects.get(pk=output["id"])
    assert artifact.sha256 == output["sha256"]
    assert blob_store.exists(artifact.sha256)
    content = api_client.get(output and f"/api/v1/artifacts/{output['id']}/content")
    assert content.status_code == 200
    assert b"".join(content.streaming_content).startswith(b"date,close")
    assert content["X-Content-Type-Options"] == "nosniff"


def test_a_task_runs_to_done_and_then_says_there_is_nothing_to_run(api_client):
    task = new_task(api_client)
    run(api_client, task["id"])
    second = run(api_client, task["id"]).json()
    assert second["task"]["status"] in ("running", "done")
    third = run(api_client, task["id"]).json()
    assert third["ran"] is False
    assert third["task"]["status"] == "done"
    chart = Step.objects.get(task_id=task["id"], position=2).output
    assert list(chart.source_links.values_list("source_id", flat=True)) == [
        Step.objects.get(task_id=task["id"], position=1).output_id
    ]


def test_a_second_worker_is_told_the_lease_is_held(api_client):
    task = new_task(api_client)
    run(api_client, task["id"], worker="first")
    response = run(api_client, task["id"], worker="second")
    assert response.status_code == 409
    assert "holds the task's lease" in response.json()["detail"]


def test_a_runner_that_releases_its_lease_lets_another_go_on(api_client):
    task = new_task(api_client)
    run(api_client, task["id"], worker="first")
    released = api_client.post(
        f"/api/v1/tasks/{task['id']}/lease/release", {"worker": "first"}
    )
    assert released.json()["lease_owner"] == ""
    assert run(api_client, task["id"], worker="second").json()["ran"] is True


def test_the_resume_context_shows_done_steps_as_refs_with_a_short_excerpt(
    api_client,
):
    task = new_task(api_client)
    run(api_client, task["id"])
    context = api_client.get(f"/api/v1/tasks/{task['id']}/resume-context").json()
    assert context["schema"] == "pippa.resume/3"
    (done,) = context["recent"]
    output = Step.objects.get(task_id=task["id"], position=1).output
    assert done["title"] == "Fetch closes"
    assert done["output"]["sha256"] == output.sha256
    assert done["excerpt"].startswith("date,close")
    assert len(done["excerpt"]) < 200 < output.size  # an excerpt, never the payload
    assert context["next"][0]["title"] == "Chart them"


def test_a_smaller_resume_context_is_trimmed_by_rule_and_a_bad_size_is_a_422(
    api_client,
):
    task = new_task(api_client)
    run(api_client, task["id"])
    url = f"/api/v1/tasks/{task['id']}/resume-context"
    small = api_client.get(url, data={"max_chars": 1500})
    assert small.status_code == 200
    assert len(json.dumps(small.json(), ensure_ascii=False)) <= 1500
    for bad in (1499, 4001, "many"):
        response = api_client.get(url, data={"max_chars": bad})
        assert response.status_code == 422, bad
        assert "max_chars" in response.json()["detail"]


def test_read_steps_pages_through_the_plan_and_refuses_a_bad_range(api_client):
    task = first_step_done(api_client)
    url = f"/api/v1/tasks/{task['id']}/steps"
    page = api_client.get(url, data={"limit": 1}).json()
    assert [s["title"] for s in page["steps"]] == ["Fetch closes"]
    assert page["next_from_position"] == 2
    assert page["steps"][0]["output"]["artifact_class"] == 2
    done = api_client.get(url, data={"status": "done"}).json()
    assert [s["position"] for s in done["steps"]] == [1]
    refused = api_client.get(url, data={"from_position": 2, "to_position": 1})
    assert refused.status_code == 400
    assert "comes before" in refused.json()["detail"]
    assert api_client.get(url, data={"status": "finished"}).status_code == 422
    assert api_client.get(url, data={"limit": 51}).status_code == 422


def test_a_note_is_saved_and_the_next_resume_context_shows_it(api_client):
    task = new_task(api_client)
    response = api_client.post(
        f"/api/v1/tasks/{task['id']}/note", {"text": "Chart January only."}
    )
    assert response.status_code == 201
    note = response.json()
    assert note["text"] == "Chart January only."
    context = api_client.get(f"/api/v1/tasks/{task['id']}/resume-context").json()
    assert context["note"] == note
    too_long = api_client.post(f"/api/v1/tasks/{task['id']}/note", {"text": "x" * 1001})
    assert too_long.status_code == 422


def test_an_agent_completes_a_step_it_did_itself_and_a_second_send_changes_nothing(
    api_client,
):
    task = new_task(api_client)
    steps = list(Step.objects.filter(task_id=task["id"]).order_by("position"))
    url = f"/api/v1/tasks/{task['id']}/steps/{steps[0].pk}/complete"
    body = {
        "worker": "claude-laptop",
        "content": "date,close\n2024-01-02,10.5\n",
        "media_type": "text/csv",
        "title": "Closes I fetched myself",
    }
    first = api_client.post(url, body)
    assert first.status_code == 200, first.content
    answer = first.json()
    assert (answer["completed"], answer["already"]) == (True, False)
    assert answer["step"]["status"] == "done"
    assert answer["step"]["output"]["artifact_class"] == 2  # the step's class
    assert answer["task"]["steps_done"] == 1
    assert answer["task"]["lease_owner"] == ""  # held only during the call
    output = Artifact.objects.get(pk=answer["step"]["output"]["id"])
    assert default_store().get(output.sha256) == body["content"].encode()
    kinds = list(
        Event.objects.filter(step_id=steps[0].pk)
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["tool_call_started", "payload_persisted", "tool_result_persisted"]
    again = api_client.post(url, body)
    assert again.status_code == 200
    assert again.json()["already"] is True
    assert again.json()["step"]["output"]["id"] == output.pk
    assert Event.objects.filter(step_id=steps[0].pk).count() == 3
    other = api_client.post(url, {**body, "content": "different bytes"})
    assert other.status_code == 409
    assert "its output stands" in other.json()["detail"]


def test_completing_a_step_while_another_worker_holds_the_lease_is_a_409(api_client):
    task = new_task(api_client)
    run(api_client, task["id"], worker="busy-runner")
    step_id = Step.objects.get(task_id=task["id"], position=2).pk
    response = api_client.post(
        f"/api/v1/tasks/{task['id']}/steps/{step_id}/complete",
        {"worker": "agent", "content": "<svg/>", "media_type": "image/svg+xml"},
    )
    assert response.status_code == 409
    assert response.json()["code"] == "lease_held"
    assert Step.objects.get(pk=step_id).status == "pending"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"content": ""}, 422, "content"),
        ({"content": "!!", "encoding": "base64"}, 400, "not valid base64"),
        ({"content": "x", "media_type": "not a type"}, 400, "media_type"),
        ({"content": "x", "source_refs": [987654]}, 404, "not found"),
    ],
)
def test_a_completion_that_cannot_be_kept_is_refused_and_nothing_is_written(
    api_client, body, status, words
):
    task = new_task(api_client)
    step_id = Step.objects.get(task_id=task["id"], position=1).pk
    response = api_client.post(
        f"/api/v1/tasks/{task['id']}/steps/{step_id}/complete",
        {"worker": "agent", **body},
    )
    assert response.status_code == status
    assert words in response.json()["detail"]
    assert not Event.objects.filter(step_id=step_id).exists()
    assert Step.objects.get(pk=step_id).status == "pending"


def test_a_plan_rewrite_that_would_change_a_done_step_is_a_409(api_client):
    task = first_step_done(api_client)
    steps = Step.objects.filter(task_id=task["id"]).order_by("position")
    new_plan = [
        {"id": steps[0].pk, "title": "Fetch other closes", "tool": "demo.closes"},
        {"id": steps[1].pk, "title": "Chart them", "tool": "demo.chart"},
    ]
    response = api_client.put(f"/api/v1/tasks/{task['id']}/plan", {"steps": new_plan})
    assert response.status_code == 409
    assert "cannot change" in response.json()["detail"]
    assert Step.objects.get(pk=steps[0].pk).title == "Fetch closes"
    assert not Event.objects.filter(task_id=task["id"], kind="plan_rewritten").exists()


def test_a_plan_rewrite_adds_a_step_after_the_done_ones(api_client):
    task = new_task(api_client)
    steps = list(Step.objects.filter(task_id=task["id"]).order_by("position"))
    new_plan = [
        {
            "id": steps[0].pk,
            "title": steps[0].title,
            "tool": steps[0].tool,
            "args": steps[0].args,
        },
        {"title": "Search news", "tool": "demo.search", "args": {"query": "PIPA"}},
        {
            "id": steps[1].pk,
            "title": steps[1].title,
            "tool": steps[1].tool,
            "args": {"source": 1},
        },
    ]
    response = api_client.put(f"/api/v1/tasks/{task['id']}/plan", {"steps": new_plan})
    assert response.status_code == 200
    assert [s["tool"] for s in response.json()["steps"]] == [
        "demo.closes",
        "demo.search",
        "demo.chart",
    ]


def test_recording_the_brain_changes_the_task_and_logs_it(api_client):
    task = new_task(api_client)
    response = api_client.post(f"/api/v1/tasks/{task['id']}/brain", {"brain": "gemini"})
    assert response.json()["brain"] == "gemini"
    event = Event.objects.get(task_id=task["id"], kind="brain_changed")
    assert event.data["previous"] == "scripted"


# -- uploads ------------------------------------------------------------------


def upload_url(task_id, **params):
    from urllib.parse import urlencode

    return f"/api/v1/tasks/{task_id}/artifacts?" + urlencode(params, doseq=True)


def test_an_upload_is_stored_with_its_class_and_source_refs(api_client, blob_store):
    task = new_task(api_client)
    run(api_client, task["id"])
    source = Step.objects.get(task_id=task["id"], position=1).output
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"/>'
    response = api_client.upload(
        upload_url(
            task["id"], artifact_class=4, title="widget", source_refs=[source.pk]
        ),
        svg,
        media_type="image/svg+xml",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["artifact_class"] == 4
    assert body["source_refs"] == [source.pk]
    assert body["media_type"] == "image/svg+xml"
    assert blob_store.get(body["sha256"]) == svg
    assert TaskArtifact.objects.filter(
        task_id=task["id"], artifact_id=body["id"]
    ).exists()


def test_an_upload_with_an_invalid_class_is_a_422_and_writes_nothing(
    api_client, blob_store
):
    task = new_task(api_client)
    before = table_counts()
    response = api_client.upload(upload_url(task["id"], artifact_class=7), b"data")
    assert response.status_code == 422
    assert "artifact_class" in response.json()["detail"]
    assert table_counts() == before
    assert list(blob_store.shas()) == []


def test_an_oversized_upload_is_a_413_and_leaves_no_blob(
    api_client, blob_store, settings
):
    settings.PIPPA_MAX_UPLOAD_BYTES = 1024
    task = new_task(api_client)
    before = table_counts()
    response = api_client.upload(upload_url(task["id"], artifact_class=3), b"x" * 4096)
    assert response.status_code == 413
    assert "1024 bytes" in response.json()["detail"]
    assert table_counts() == before
    assert list(blob_store.shas()) == []
    assert list(blob_store.iter_temp_files()) == []


def test_an_upload_naming_someone_elses_artifact_as_a_source_is_refused(
    make_api_client, blob_store
):
    owner, stranger = make_api_client(), make_api_client()
    theirs = new_task(owner)
    run(owner, theirs["id"])
    secret = Step.objects.get(task_id=theirs["id"], position=1).output_id
    mine = new_task(stranger)
    before = ArtifactSource.objects.count(), Artifact.objects.count()
    response = stranger.upload(
        upload_url(mine["id"], artifact_class=4, source_refs=[secret]), b"<svg/>"
    )
    assert response.status_code == 404
    assert (ArtifactSource.objects.count(), Artifact.objects.count()) == before


def test_an_upload_for_a_step_of_another_task_is_a_400(api_client):
    task = new_task(api_client)
    other = new_task(api_client)
    foreign_step = Step.objects.filter(task_id=other["id"]).first()
    response = api_client.upload(
        upload_url(task["id"], artifact_class=3, step_id=foreign_step.pk), b"abc"
    )
    assert response.status_code == 400
    assert "is not a step of task" in response.json()["detail"]


def test_an_empty_upload_is_a_400(api_client):
    task = new_task(api_client)
    response = api_client.upload(upload_url(task["id"], artifact_class=3), b"")
    assert response.status_code == 400
    assert "empty" in response.json()["detail"]


def test_the_upload_is_streamed_not_read_whole(api_client, monkeypatch):
    """The view hands the blob store an iterator of chunks, never request.body."""
    from django.http import HttpRequest

    def refuse(self):
        raise AssertionError("request.body was read")

    monkeypatch.setattr(HttpRequest, "body", property(refuse))
    task_id = Task.objects.create(
        conversation=Conversation.objects.create(owner=api_client.user, title="c"),
        title="t",
    ).pk
    response = api_client.upload(upload_url(task_id, artifact_class=3), b"y" * 300_000)
    assert response.status_code == 201
    assert response.json()["size"] == 300_000


# -- council ------------------------------------------------------------------


def test_the_council_context_carries_refs_not_payloads(api_client):
    from council.services import round_start, turn_add

    conversation = Conversation.objects.create(owner=api_client.user, title="c")
    council_round = round_start(
        conversation=conversation,
        topic="Which chart?",
        participants=[("Ada", "claude"), ("Bo", "gemini")],
    )
    ada = council_round.participants.get(name="Ada")
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="5" height="5"/></svg>'
    turn_add(
        council_round=council_round, participant=ada, text="Here is mine", widget=svg
    )
    rounds = api_client.get(f"/api/v1/conversations/{conversation.pk}/council").json()
    assert rounds[0]["participants"][1]["brain"] == "gemini"
    context = api_client.get(
        f"/api/v1/council/rounds/{council_round.pk}/context"
    ).json()
    assert context["for"]["name"] == "Bo"
    ref = context["turns"][0]["artifact_refs"][0]
    assert ref["media_type"] == "image/svg+xml"
    assert "<rect" not in str(context)
    content = api_client.get(f"/api/v1/artifacts/{ref['id']}/content")
    assert b"".join(content.streaming_content) == svg


@pytest.mark.parametrize("staff", [False, True], ids=["user", "staff"])
def test_another_users_council_round_is_a_404(make_api_client, make_user, staff):
    from council.services import round_start

    owner = make_api_client()
    stranger = make_api_client(make_user(is_staff=staff))
    conversation = Conversation.objects.create(owner=owner.user, title="c")
    council_round = round_start(
        conversation=conversation, topic="t", participants=[("Ada", "claude")]
    )
    response = stranger.get(f"/api/v1/council/rounds/{council_round.pk}/context")
    assert response.status_code == 404


def test_the_blob_store_fixture_is_this_tests_own(blob_store, settings):
    assert isinstance(blob_store, BlobStore)
    assert str(blob_store.root) == str(settings.BLOB_DIR)


def test_uploading_bytes_another_user_stored_makes_their_own_row_and_edits_nothing(
    make_api_client,
):
    owner, other = make_api_client(), make_api_client()
    first = new_task(owner)
    run(owner, first["id"])
    source = Step.objects.get(task_id=first["id"], position=1).output_id
    url = upload_url(first["id"], artifact_class=4, title="mine", source_refs=[source])
    created = owner.upload(url, b"<svg>same bytes</svg>").json()
    second = new_task(other)
    run(other, second["id"])
    their_source = Step.objects.get(task_id=second["id"], position=1).output_id
    again = other.upload(
        upload_url(second["id"], artifact_class=3, source_refs=[their_source]),
        b"<svg>same bytes</svg>",
    )
    assert again.status_code == 201
    assert again.json()["id"] != created["id"]
    assert again.json()["artifact_class"] == 3
    assert again.json()["source_refs"] == [their_source]
    assert again.json()["sha256"] == created["sha256"]
    assert Artifact.objects.get(pk=created["id"]).artifact_class == 4
    assert list(
        ArtifactSource.objects.filter(artifact_id=created["id"]).values_list(
            "source_id", flat=True
        )
    ) == [source]


def test_uploading_bytes_the_owner_stored_reuses_the_owners_row_as_it_is(
    api_client,
):
    task = new_task(api_client)
    url = upload_url(task["id"], artifact_class=4, title="first")
    created = api_client.upload(url, b"<svg>mine</svg>").json()
    again = api_client.upload(
        upload_url(task["id"], artifact_class=3, title="second"), b"<svg>mine</svg>"
    )
    assert again.status_code == 201
    assert again.json()["id"] == created["id"]
    assert (again.json()["artifact_class"], again.json()["title"]) == (4, "first")


def test_there_is_no_cdn_backed_docs_page(client):
    assert client.get("/api/v1/docs").status_code == 404


def test_a_plan_rewrite_claiming_a_wrong_status_is_a_409_that_changes_nothing(
    api_client,
):
    task = new_task(api_client)
    steps = [
        {"id": s["id"], "title": s["title"], "tool": s["tool"], "args": s["args"]}
        for s in task["steps"]
    ]
    steps[0]["status"] = "done"
    response = api_client.put(f"/api/v1/tasks/{task['id']}/plan", {"steps": steps})
    assert response.status_code == 409
    assert response.json()["detail"].startswith("step 1 is pending, not done")
    assert not Event.objects.filter(task_id=task["id"], kind="plan_rewritten").exists()
