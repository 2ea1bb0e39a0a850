"""Deleting a conversation from the dashboard: a preview first, then the service."""

from __future__ import annotations

import pytest
from django.db.models import FETCH_RAISE
from django.db.models import query as query_module
from django.test import Client
from django.urls import reverse

from artifacts.models import Artifact
from tasks.models import Conversation, Task, TaskArtifact
from tasks.services import conversation_deletion_preview
from tests.support.leftovers import (
    assert_no_leftovers,
    conversation_with_everything,
    subtree_snapshot,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(user):
    """Dad's conversation whose closes another of his conversations also keeps."""
    doomed, artifacts = conversation_with_everything(owner=user, title="Old study")
    keeper, _ = conversation_with_everything(owner=user, title="Keeper")
    keeper_task = Task.objects.get(conversation=keeper)
    TaskArtifact.objects.create(
        task=keeper_task, artifact=artifacts["closes"], role="referenced"
    )
    return {"doomed": doomed, "keeper": keeper, "closes": artifacts["closes"]}


def _url(conversation) -> str:
    return reverse("dashboard:conversation_delete", args=[conversation.pk])


def test_the_confirmation_lists_what_goes_and_what_stays_before_anything_is_removed(
    dad_client, shared, monkeypatch
):
    monkeypatch.setattr(query_module, "DEFAULT_FETCH_MODE", FETCH_RAISE)
    doomed = shared["doomed"]
    preview = conversation_deletion_preview(conversation=doomed)

    response = dad_client.get(_url(doomed))

    body = response.content.decode()
    assert response.status_code == 200
    assert "Delete “<bdi>Old study</bdi>”?" in body
    counts = preview.removed_counts()
    assert counts["tasks"] == 1
    assert "<dt>conversation</dt><dd>1</dd>" in body
    assert "<dt>task</dt><dd>1</dd>" in body
    assert f"<dt>steps</dt><dd>{counts['steps']}</dd>" in body
    # Log events and artifact links are an engineer's words: under Details.
    details = body[body.index('<details class="engineer">') :]
    assert f"<dt>log events</dt><dd>{counts['events']}</dd>" in details
    assert f"<dt>artifact links</dt><dd>{counts['links']}</dd>" in details
    assert f"<dt>council turns</dt><dd>{counts['turns']}</dd>" in body
    assert "Will stay, because it is shared" in body
    kept = preview.kept_artifacts[0]
    assert kept.id == shared["closes"].pk
    assert kept.reason in body
    for record in preview.removed_artifacts:
        assert record.title in body
    # The button counts what the tiles show, not the log's rows.
    shown = sum(
        n
        for key, n in preview.removed_counts().items()
        if key not in ("events", "links")
    )
    assert shown < preview.total_removed
    assert f"Delete this conversation ({shown} items)" in body
    assert Conversation.objects.filter(pk=doomed.pk).exists()


def test_the_conversation_page_links_to_the_confirmation_not_straight_to_delete(
    dad_client, shared
):
    body = dad_client.get(shared["doomed"].get_absolute_url()).content.decode()
    assert f'href="{_url(shared["doomed"])}"' in body
    assert "Delete this conversation…" in body
    # Not the first thing under the title: after the tasks and rounds.
    assert body.index("Delete this conversation…") > body.index('id="rounds-heading"')


def test_confirming_deletes_through_the_service_and_leaves_nothing_behind(
    dad_client, shared, django_capture_on_commit_callbacks
):
    doomed = shared["doomed"]
    before = subtree_snapshot(doomed.pk)
    with django_capture_on_commit_callbacks(execute=True):
        response = dad_client.post(_url(doomed))
    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard:conversations")
    assert not Conversation.objects.filter(pk=doomed.pk).exists()
    assert Artifact.objects.filter(pk=shared["closes"].pk).exists()
    assert_no_leftovers(before)
    listing = dad_client.get(response["Location"]).content.decode()
    assert (
        "Deleted “Old study” with 1 council round, 2 council turns, 1 task," in listing
    )
    assert "1 conversations" not in listing
    assert "Keeper" in listing


def test_an_empty_conversation_says_nothing_is_shared_and_deletes_cleanly(
    dad_client, user, make_conversation, django_capture_on_commit_callbacks
):
    empty = make_conversation(owner=user, title="Nothing here")
    page = dad_client.get(_url(empty)).content.decode()
    assert "Nothing is shared" in page
    with django_capture_on_commit_callbacks(execute=True):
        dad_client.post(_url(empty))
    assert not Conversation.objects.filter(pk=empty.pk).exists()
    assert_no_leftovers()


def test_another_users_conversation_can_be_neither_previewed_nor_deleted(
    dad_client, make_user
):
    theirs, _ = conversation_with_everything(
        owner=make_user(username="neighbour"), title="Neighbour's"
    )
    assert dad_client.get(_url(theirs)).status_code == 404
    assert dad_client.post(_url(theirs)).status_code == 404
    assert Conversation.objects.filter(pk=theirs.pk).exists()


def test_a_forged_delete_without_a_csrf_token_is_refused(user, shared):
    forger = Client(enforce_csrf_checks=True)
    forger.force_login(user)
    response = forger.post(_url(shared["doomed"]))
    assert response.status_code == 403
    assert Conversation.objects.filter(pk=shared["doomed"].pk).exists()


def test_staff_cannot_delete_anothers_conversation_from_the_dashboard(
    client, make_user
):
    """Staff see it, but a delete acts on their own rows; the admin deletes
    another user's (tests/test_admin_delete.py)."""
    theirs, _ = conversation_with_everything(owner=make_user(username="mum"))
    client.force_login(make_user(username="boss", is_staff=True))
    before = subtree_snapshot(theirs.pk)
    assert client.get(theirs.get_absolute_url()).status_code == 200
    assert client.post(_url(theirs)).status_code == 404
    assert subtree_snapshot(theirs.pk) == before
