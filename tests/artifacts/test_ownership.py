"""Artifacts belong to their owner: two users, every way one's artifact could
reach the other.

The blob store is shared (identical bytes are one file); rows are not. Each
test ends by checking that the first user's rows kept their title, class,
media type and lineage, whatever the second user did.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from api.services import token_create
from artifacts.models import Artifact, ArtifactClass
from artifacts.services import ERR_UNKNOWN_SOURCE, ArtifactError, artifact_store
from artifacts.store import default_store
from council.services import (
    ERR_UNKNOWN_CITE,
    CouncilError,
    round_start,
    turn_add,
    widget_store,
)
from tasks.models import Conversation, Step, Task
from tasks.plan import task_create
from tasks.tools import ToolResult, tool_register
from tests.support.executing import run_task

pytestmark = pytest.mark.django_db

# Two widgets that draw the same picture; only A's carries hidden text.
A_WIDGET = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60">'
    b"<desc>A's private note: the account number is 0042</desc>"
    b'<rect width="120" height="60" fill="#2f6f8f"/></svg>'
)
B_WIDGET = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60">'
    b'<rect width="120" height="60" fill="#2f6f8f"/></svg>'
)
CLOSES_ARGS = {"symbol": "PIPA", "start": "2024-01-02", "end": "2024-01-31"}


def _cite(ctx, *, source_ids=(), **args):
    """A render that names whatever source ids its args say."""
    return ToolResult(
        data=b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        media_type="image/svg+xml",
        source_ids=list(source_ids),
    )


tool_register("ownership.cite", _cite, artifact_class=ArtifactClass.RENDER)


def rows_of(user) -> dict[int, tuple]:
    """Everything a user's rows say about themselves, lineage included."""
    return {
        a.pk: (
            a.title,
            a.artifact_class,
            a.media_type,
            a.sha256,
            tuple(a.source_links.values_list("source_id", flat=True)),
        )
        for a in Artifact.objects.filter(owner=user).order_by("pk")
    }


def api(client, user):
    raw = token_create(user=user, name="runner").raw
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def upload(client, headers, task_id, body, media_type, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.generic(
        "POST",
        f"/api/v1/tasks/{task_id}/artifacts?{query}",
        body,
        content_type=media_type,
        **headers,
    )


def run_plan(owner, steps, title="Closes"):
    conversation = Conversation.objects.create(owner=owner, title=title)
    task = task_create(conversation=conversation, title=title, steps=steps)
    run_task(task.pk)
    task.refresh_from_db()
    return task


@pytest.fixture
def alice(make_user):
    return make_user(username="alice")


@pytest.fixture
def bob(make_user):
    return make_user(username="bob")


def test_identical_bytes_uploaded_by_two_users_are_two_rows_over_one_blob(
    client, alice, bob
):
    a_task = task_create(
        conversation=Conversation.objects.create(owner=alice, title="a"),
        title="a",
        steps=[{"title": "s", "tool": "demo.closes"}],
        queue=False,
    )
    b_task = task_create(
        conversation=Conversation.objects.create(owner=bob, title="b"),
        title="b",
        steps=[{"title": "s", "tool": "demo.closes"}],
        queue=False,
    )
    body = b"date,close\n2024-01-02,100.0\n"
    a_response = upload(
        client,
        api(client, alice),
        a_task.pk,
        body,
        "text/csv",
        artifact_class=2,
        title="closes",
    )
    before = rows_of(alice)
    b_response = upload(
        client,
        api(client, bob),
        b_task.pk,
        body,
        "text/html",
        artifact_class=3,
        title="URGENT: re-enter your bank login",
    )

    assert a_response.status_code == b_response.status_code == 201
    a_id, b_id = a_response.json()["id"], b_response.json()["id"]
    assert a_id != b_id
    assert b_response.json()["title"] == "URGENT: re-enter your bank login"
    assert Artifact.objects.get(pk=b_id).owner == bob
    assert len(list(default_store().shas())) == 1
    assert rows_of(alice) == before
    assert before[a_id][:3] == ("closes", 2, "text/csv")


def test_a_pre_uploaded_lookalike_sets_nothing_on_the_owners_step_output(
    client, alice, bob
):
    """B stores the bytes A's class-2 fetch will produce, as class-3 HTML with
    a phishing title; A's step output is still A's: class 2, CSV, A's title."""
    b_task = task_create(
        conversation=Conversation.objects.create(owner=bob, title="b"),
        title="b",
        steps=[{"title": "s", "tool": "demo.closes"}],
        queue=False,
    )
    # The bytes A's fetch produces (B can compute them as well as A can).
    a_first = run_plan(
        alice, [{"title": "fetch", "tool": "demo.closes", "args": CLOSES_ARGS}]
    )
    csv = default_store().get(a_first.steps.get().output.sha256)
    response = upload(
        client,
        api(client, bob),
        b_task.pk,
        csv,
        "text/html",
        artifact_class=3,
        title="URGENT: re-enter your bank login",
    )
    assert response.status_code == 201

    task = run_plan(
        alice, [{"title": "fetch again", "tool": "demo.closes", "args": CLOSES_ARGS}]
    )

    output = task.steps.get().output
    assert output.owner == alice
    assert output.pk == a_first.steps.get().output_id  # the owner's own row, reused
    assert (output.artifact_class, output.media_type) == (2, "text/csv")
    assert output.title == "PIPA unadjusted closes 2024-01-02 to 2024-01-31"
    client.force_login(alice)
    page = client.get(reverse("dashboard:task", args=[task.pk])).content.decode()
    assert "URGENT" not in page


def test_identical_executor_outputs_of_two_users_are_two_rows(client, alice, bob):
    plan = [{"title": "fetch", "tool": "demo.closes", "args": CLOSES_ARGS}]
    a_task = run_plan(alice, plan)
    before = rows_of(alice)
    b_task = run_plan(bob, plan)

    a_out, b_out = a_task.steps.get().output, b_task.steps.get().output
    assert a_out.sha256 == b_out.sha256
    assert a_out.pk != b_out.pk
    assert (a_out.owner, b_out.owner) == (alice, bob)
    assert rows_of(alice) == before
    client.force_login(bob)
    for name in ("detail", "source", "source_text", "preview"):
        url = reverse(f"artifacts:{name}", args=[a_out.pk])
        assert client.get(url).status_code == 404, name


def test_an_identical_rendered_preview_lands_on_each_owners_own_row(client, alice, bob):
    a_widget, a_preview = widget_store(owner=alice, data=A_WIDGET, title="A's chart")
    before = rows_of(alice)
    b_widget, b_preview = widget_store(owner=bob, data=B_WIDGET, title="B's chart")

    assert a_preview is not None
    assert b_preview is not None
    assert a_preview.sha256 == b_preview.sha256  # the same picture, one blob
    assert a_preview.pk != b_preview.pk
    assert list(b_preview.sources.all()) == [b_widget]
    assert list(a_preview.sources.all()) == [a_widget]
    assert b_preview.owner == bob
    assert rows_of(alice) == before
    client.force_login(bob)
    page = client.get(reverse("artifacts:detail", args=[b_preview.pk])).content
    assert b"A&#x27;s chart" not in page
    assert b"A's chart" not in page
    for artifact in (a_widget, a_preview):
        for name in ("detail", "source", "source_text", "preview"):
            url = reverse(f"artifacts:{name}", args=[artifact.pk])
            assert client.get(url).status_code == 404, (artifact, name)


def test_source_refs_naming_another_users_artifact_are_refused_like_an_unknown_id(
    client, alice, bob, make_artifact
):
    mine = make_artifact(owner=alice, title="A's data")
    before = rows_of(alice)

    for bad in (mine.pk, 999_999):
        with pytest.raises(ArtifactError) as refused:
            artifact_store(
                owner=bob,
                data=b"derived",
                media_type="text/plain",
                artifact_class=4,
                source_ids=[bad],
            )
        assert str(refused.value) == ERR_UNKNOWN_SOURCE
    b_task = task_create(
        conversation=Conversation.objects.create(owner=bob, title="b"),
        title="b",
        steps=[{"title": "s", "tool": "demo.closes"}],
        queue=False,
    )
    headers = api(client, bob)
    answers = [
        upload(
            client,
            headers,
            b_task.pk,
            b"x",
            "text/plain",
            artifact_class=4,
            source_refs=bad,
        )
        for bad in (mine.pk, 999_999)
    ]
    assert [r.status_code for r in answers] == [404, 404]
    assert [r.json()["detail"].split(" ")[0] for r in answers] == ["artifact"] * 2
    assert not Artifact.objects.filter(owner=bob).exists()
    assert rows_of(alice) == before


def test_a_step_whose_tool_names_another_users_artifact_fails_its_attempt(
    alice, bob, make_artifact
):
    mine = make_artifact(owner=alice, title="A's data")
    before = rows_of(alice)
    task = run_plan(
        bob,
        [
            {
                "title": "cite",
                "tool": "ownership.cite",
                "args": {"source_ids": [mine.pk]},
                "max_attempts": 1,
            }
        ],
    )

    step = task.steps.get()
    assert step.status == Step.Status.FAILED
    assert ERR_UNKNOWN_SOURCE in step.error
    assert step.output_id is None
    assert not Artifact.objects.filter(owner=bob).exists()
    assert rows_of(alice) == before


def test_a_council_turn_cannot_cite_or_derive_from_another_users_artifact(
    alice, bob, make_artifact
):
    mine = make_artifact(owner=alice, title="A's data")
    before = rows_of(alice)
    council_round = round_start(
        conversation=Conversation.objects.create(owner=bob, title="b"),
        topic="t",
        participants=[("Ada", "claude")],
    )
    speaker = council_round.participants.get()

    with pytest.raises(CouncilError, match=ERR_UNKNOWN_CITE):
        turn_add(
            council_round=council_round,
            participant=speaker,
            text="see",
            cites=[mine.pk],
        )
    with pytest.raises(ArtifactError, match=ERR_UNKNOWN_SOURCE):
        turn_add(
            council_round=council_round,
            participant=speaker,
            text="",
            widget=B_WIDGET,
            widget_source_ids=[mine.pk],
        )
    assert not council_round.turns.exists()
    assert rows_of(alice) == before


def test_every_door_answers_404_for_another_users_artifact_by_id(
    client, alice, bob, make_artifact
):
    mine = make_artifact(owner=alice, title="A's data")
    before = rows_of(alice)
    client.force_login(bob)
    for artifact_id in (mine.pk, 999_999):
        for name in ("detail", "source", "source_text", "preview"):
            url = reverse(f"artifacts:{name}", args=[artifact_id])
            assert client.get(url).status_code == 404, name
        verify = reverse("artifacts:verify", args=[artifact_id])
        assert client.post(verify).status_code == 404
    headers = api(client, bob)
    for artifact_id in (mine.pk, 999_999):
        for path in (
            f"/api/v1/artifacts/{artifact_id}",
            f"/api/v1/artifacts/{artifact_id}/content",
        ):
            response = client.get(path, **headers)
            assert response.status_code == 404
            assert response.json()["detail"] == (
                f"artifact {artifact_id} not found (or not yours)"
            )
    assert rows_of(alice) == before


def test_a_staff_token_acts_only_as_its_own_user(client, alice, make_user):
    task = run_plan(
        alice, [{"title": "fetch", "tool": "demo.closes", "args": CLOSES_ARGS}]
    )
    output = task.steps.get().output
    staff = make_user(username="operator", is_staff=True)
    headers = api(client, staff)

    for path in (
        f"/api/v1/tasks/{task.pk}",
        f"/api/v1/conversations/{task.conversation_id}",
        f"/api/v1/artifacts/{output.pk}",
        f"/api/v1/artifacts/{output.pk}/content",
    ):
        assert client.get(path, **headers).status_code == 404, path
    assert client.get("/api/v1/conversations", **headers).json() == []
    run = client.post(
        f"/api/v1/tasks/{task.pk}/steps/run",
        {"worker": "w"},
        content_type="application/json",
        **headers,
    )
    assert run.status_code == 404
    assert Task.objects.get(pk=task.pk).lease_owner == ""
