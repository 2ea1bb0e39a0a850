"""Text the databases cannot store gets a clear 4xx at every door, on SQLite
and PostgreSQL alike, at any depth of JSON; media types follow one rule;
unknown API paths answer JSON; titles and turn text cannot flip the text that
follows them."""

from __future__ import annotations

import pytest
from django.urls import reverse

from api.services import token_create
from pippa_site.text import MAX_JSON_DEPTH, TextError, media_type_check, title_clean
from tasks.models import Conversation, Step, Task

pytestmark = pytest.mark.django_db

NUL = "before\x00after"
RLO = "Invoice \u202etxt.exe\u202c paid"
PLAN = [{"title": "Fetch closes", "tool": "demo.closes", "args": {}}]


@pytest.fixture
def bearer(user):
    raw = token_create(user=user, name="runner").raw
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def _post(client, path, body, headers):
    return client.post(path, body, content_type="application/json", **headers)


def _counts():
    return Conversation.objects.count(), Task.objects.count(), Step.objects.count()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"conversation_title": NUL, "title": "t", "steps": PLAN},
            "conversation_title",
        ),
        ({"conversation_title": "c", "title": NUL, "steps": PLAN}, "title"),
        (
            {
                "conversation_title": "c",
                "title": "t",
                "steps": [{**PLAN[0], "title": NUL}],
            },
            "title",
        ),
        (
            {
                "conversation_title": "c",
                "title": "t",
                "steps": [{**PLAN[0], "args": {"symbol": NUL}}],
            },
            "args",
        ),
        (
            {
                "conversation_title": "c",
                "title": "t",
                "steps": [{**PLAN[0], "args": {NUL: 1}}],
            },
            "args",
        ),
    ],
)
def test_nul_in_any_api_text_field_is_a_422_naming_it_and_nothing_is_written(
    client, bearer, body, field
):
    before = _counts()
    response = _post(client, "/api/v1/tasks", body, bearer)

    assert response.status_code == 422
    assert field in response.json()["detail"]
    assert "cannot be stored" in response.json()["detail"]
    assert _counts() == before


def test_nul_in_a_worker_name_and_a_conversation_title_is_a_422(client, bearer, user):
    conversation = Conversation.objects.create(owner=user, title="c")
    task = Task.objects.create(conversation=conversation, title="t")

    run = _post(client, f"/api/v1/tasks/{task.pk}/steps/run", {"worker": NUL}, bearer)
    created = _post(client, "/api/v1/conversations", {"title": NUL}, bearer)

    assert run.status_code == 422
    assert "worker" in run.json()["detail"]
    assert created.status_code == 422
    assert Conversation.objects.count() == 1
    assert Task.objects.get(pk=task.pk).lease_owner == ""


def test_nul_in_an_upload_title_query_is_a_400_and_stores_nothing(
    client, bearer, user, blob_store
):
    from artifacts.models import Artifact

    task = Task.objects.create(
        conversation=Conversation.objects.create(owner=user, title="c"), title="t"
    )
    response = client.generic(
        "POST",
        f"/api/v1/tasks/{task.pk}/artifacts?artifact_class=3&title=a%00b",
        b"payload",
        content_type="text/plain",
        **bearer,
    )

    assert response.status_code == 400
    assert "Query parameter 'title'" in response.json()["detail"]
    assert not Artifact.objects.exists()
    assert list(blob_store.shas()) == []


def test_nul_in_the_dashboard_search_is_a_400_not_a_500(client, user):
    client.force_login(user)
    response = client.get(reverse("dashboard:conversations"), {"q": NUL})

    assert response.status_code == 400
    assert b"cannot be stored" in response.content


def test_nul_in_a_token_name_is_a_400_and_no_token_is_made(client, user):
    from api.models import ApiToken

    client.force_login(user)
    response = client.post(reverse("tokens:new"), {"name": NUL})

    assert response.status_code == 400
    assert b"Form field 'name'" in response.content
    assert not ApiToken.objects.exists()


def _admin_title_edit(client, make_user, owner, title: str):
    """A superuser posts ``title`` to the admin form of ``owner``'s conversation
    titled "c"; return the response and the conversation's title afterwards."""
    conversation = Conversation.objects.create(owner=owner, title="c")
    client.force_login(make_user(is_staff=True, is_superuser=True))
    url = reverse("admin:tasks_conversation_change", args=[conversation.pk])
    response = client.post(url, {"title": title})
    return response, Conversation.objects.get(pk=conversation.pk).title


def test_nul_in_an_admin_form_is_a_400(client, make_user, user):
    response, title = _admin_title_edit(client, make_user, user, NUL)

    assert response.status_code == 400
    assert title == "c"


def test_a_token_name_with_nul_is_refused_by_the_service_too(user):
    from pippa_site.errors import Invalid

    with pytest.raises(Invalid, match="cannot be stored"):
        token_create(user=user, name=NUL)


def test_an_unknown_api_path_answers_json_404(client, bearer):
    for path in ("/api/v1/nope", "/api/v1/tasks/1/nope", "/api/v2/tasks"):
        response = client.get(path, **bearer)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert "no such API endpoint" in response.json()["detail"]


def test_bidi_controls_are_stripped_from_titles_at_every_write(client, bearer, user):
    response = _post(
        client,
        "/api/v1/tasks",
        {"conversation_title": RLO, "title": RLO, "steps": [{**PLAN[0], "title": RLO}]},
        bearer,
    )
    assert response.status_code == 201
    task = Task.objects.get(pk=response.json()["id"])
    clean = "Invoice txt.exe paid"
    assert (task.title, task.conversation.title, task.steps.get().title) == (clean,) * 3
    assert title_clean(RLO) == clean


def test_titles_on_the_dashboard_are_isolated_in_bdi(client, user):
    conversation = Conversation.objects.create(owner=user, title="Closes")
    task = Task.objects.create(conversation=conversation, title="Chart")
    client.force_login(user)

    page = client.get(reverse("dashboard:task", args=[task.pk])).content.decode()
    listing = client.get(reverse("dashboard:conversations")).content.decode()

    assert "<h1><bdi>Chart</bdi></h1>" in page
    assert "<bdi>Closes</bdi>" in listing


def test_an_admin_edit_of_a_title_loses_its_bidi_controls(client, make_user, user):
    response, title = _admin_title_edit(client, make_user, user, RLO)

    assert response.status_code == 302
    assert title == "Invoice txt.exe paid"


def _nested(depth: int, leaf="x"):
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize("leaf", ["x", NUL])
def test_json_nested_past_the_cap_is_a_422_and_nothing_is_written(client, bearer, leaf):
    before = _counts()
    body = {
        "conversation_title": "c",
        "title": "t",
        "steps": [{**PLAN[0], "args": _nested(MAX_JSON_DEPTH + 6, leaf)}],
    }
    response = _post(client, "/api/v1/tasks", body, bearer)

    assert response.status_code == 422
    assert f"nested more than {MAX_JSON_DEPTH} levels deep" in response.json()["detail"]
    assert _counts() == before


def test_json_within_the_cap_is_checked_at_every_level(client, bearer):
    body = {
        "conversation_title": "c",
        "title": "t",
        "steps": [{**PLAN[0], "args": _nested(MAX_JSON_DEPTH - 1, NUL)}],
    }
    response = _post(client, "/api/v1/tasks", body, bearer)

    assert response.status_code == 422
    assert "cannot be stored" in response.json()["detail"]


@pytest.mark.parametrize("content_type", ["plain", "text/", "text/pl ain"])
def test_an_upload_whose_content_type_is_not_a_media_type_is_a_400(
    client, bearer, user, blob_store, content_type
):
    from artifacts.models import Artifact

    task = Task.objects.create(
        conversation=Conversation.objects.create(owner=user, title="c"), title="t"
    )
    response = client.generic(
        "POST",
        f"/api/v1/tasks/{task.pk}/artifacts?artifact_class=3",
        b"payload",
        content_type=content_type,
        **bearer,
    )

    assert response.status_code == 400
    assert "Content-Type must be a media type" in response.json()["detail"]
    assert not Artifact.objects.exists()
    assert list(blob_store.shas()) == []


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("text/plain", True),
        ("image/svg+xml", True),
        ("text/plain; charset=utf-8", True),
        ('multipart/mixed; boundary="a b"', True),
        ("application/vnd.pippa.resume+json", True),
        ("text/plain\r\nSet-Cookie: x=1", False),
        ("text/plain\n", False),
        ("text/plain\x00", False),
        ("text", False),
        ("/plain", False),
        ("text/pl ain", False),
        ("text/plain;", False),
        ("t" * 200 + "/x", False),
    ],
)
def test_the_one_media_type_rule(value, ok):
    if ok:
        assert media_type_check(value) == value
    else:
        with pytest.raises(TextError):
            media_type_check(value)


def test_a_machine_written_media_type_that_breaks_the_rule_is_stored_as_octet_stream(
    user,
):
    from artifacts.services import artifact_store

    artifact = artifact_store(
        owner=user,
        data=b"tool output",
        media_type="text/plain\r\nX-Evil: 1",
        artifact_class=3,
    )

    assert artifact.media_type == "application/octet-stream"


def test_bidi_controls_are_stripped_from_council_turn_text(user):
    from council.services import round_start, turn_add

    conversation = Conversation.objects.create(owner=user, title="Council")
    council_round = round_start(
        conversation=conversation, topic="PIPA", participants=[("claude", "claude")]
    )
    turn = turn_add(
        council_round=council_round,
        participant=council_round.participants.get(),
        text=RLO,
    )

    turn.refresh_from_db()
    assert turn.text == "Invoice txt.exe paid"
