"""Deleting conversations from the admin: the preview first, then conversation_delete."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.urls import reverse

import tasks.admin
import tasks.services
from artifacts.models import Artifact
from tasks.models import Conversation, Task, TaskArtifact
from tasks.services import conversation_deletion_preview
from tests.support.leftovers import (
    assert_no_leftovers,
    conversation_with_everything,
    subtree_snapshot,
)

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:tasks_conversation_changelist"


@pytest.fixture
def shared(make_user):
    """Two conversations of everything; a third keeps the first one's closes."""
    owner = make_user(username="dad")
    first, first_artifacts = conversation_with_everything(owner=owner, title="First")
    second, _ = conversation_with_everything(owner=owner, title="Second")
    keeper, _ = conversation_with_everything(owner=owner, title="Keeper")
    keeper_task = Task.objects.get(conversation=keeper)
    TaskArtifact.objects.create(
        task=keeper_task, artifact=first_artifacts["closes"], role="referenced"
    )
    return {
        "first": first,
        "second": second,
        "keeper": keeper,
        "keeper_task": keeper_task,
        "closes": first_artifacts["closes"],
    }


@pytest.fixture
def spy_delete(monkeypatch):
    """Record every call of conversation_delete while still running it."""
    calls = []
    real = tasks.services.conversation_delete

    def spy(*, conversation_id):
        calls.append(conversation_id)
        return real(conversation_id=conversation_id)

    monkeypatch.setattr(tasks.services, "conversation_delete", spy)
    # The admin imports the service by name.
    monkeypatch.setattr(tasks.admin, "conversation_delete", spy)
    return calls


def _delete_url(conversation) -> str:
    return reverse("admin:tasks_conversation_delete", args=[conversation.pk])


def test_the_delete_page_shows_the_same_removed_and_kept_preview_as_the_service(
    staff_client, shared
):
    first = shared["first"]
    preview = conversation_deletion_preview(conversation=first)
    response = staff_client.get(_delete_url(first))
    assert response.status_code == 200
    body = response.content.decode()
    assert f"Removed ({preview.total_removed} rows in all)" in body
    for label, n in preview.removed_counts().items():
        assert f'<th scope="row">{label.capitalize()}</th><td>{n}</td>' in body
    assert [r.id for r in preview.kept_artifacts] == [shared["closes"].pk]
    kept = preview.kept_artifacts[0]
    assert f"kept, {kept.reason}" in body
    assert f"task “{shared['keeper_task'].title}”" in kept.reason
    for record in preview.removed_artifacts:
        assert f"Artifact {record.id} — <bdi>{record.title}</bdi>" in body
    assert "Yes, I’m sure" in body
    assert Conversation.objects.filter(pk=first.pk).exists()


def test_deleting_one_conversation_in_the_admin_runs_the_service_and_leaves_nothing(
    staff_client, shared, spy_delete, django_capture_on_commit_callbacks
):
    first = shared["first"]
    before = subtree_snapshot(first.pk)
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(_delete_url(first), {"post": "yes"})
    assert response.status_code == 302
    assert spy_delete == [first.pk]
    assert not Conversation.objects.filter(pk=first.pk).exists()
    entry = LogEntry.objects.get(action_flag=DELETION, object_id=str(first.pk))
    assert entry.user.username == "operator"
    assert Artifact.objects.filter(pk=shared["closes"].pk).exists()
    assert_no_leftovers(before)
    listing = staff_client.get(response["Location"])
    assert "was deleted successfully" in listing.content.decode()


def test_bulk_delete_confirms_with_each_preview_then_deletes_through_the_service(
    staff_client, shared, spy_delete, django_capture_on_commit_callbacks
):
    first, second = shared["first"], shared["second"]
    url = reverse(CHANGELIST)
    selected = {"action": "delete_selected", "_selected_action": [first.pk, second.pk]}
    confirm = staff_client.post(url, selected)
    assert confirm.status_code == 200
    body = confirm.content.decode()
    assert f'data-conversation="{first.pk}"' in body
    assert f'data-conversation="{second.pk}"' in body
    assert (
        f"kept, {conversation_deletion_preview(conversation=first).kept_artifacts[0].reason}"
        in body
    )
    assert spy_delete == []
    assert Conversation.objects.filter(pk__in=[first.pk, second.pk]).count() == 2

    before = subtree_snapshot(first.pk, second.pk)
    with django_capture_on_commit_callbacks(execute=True):
        done = staff_client.post(url, {**selected, "post": "yes"}, follow=True)
    assert "Deleted 2 conversation(s)" in done.content.decode()
    assert sorted(spy_delete) == sorted([first.pk, second.pk])
    assert list(Conversation.objects.values_list("pk", flat=True)) == [
        shared["keeper"].pk
    ]
    assert_no_leftovers(before)


def test_the_admin_delete_removes_exactly_what_the_service_would(
    staff_client, make_user, django_capture_on_commit_callbacks
):
    owner = make_user(username="mum")
    by_admin, _ = conversation_with_everything(owner=owner, title="Admin door")
    by_service, _ = conversation_with_everything(owner=owner, title="Service door")
    admin_preview = conversation_deletion_preview(conversation=by_admin)
    with django_capture_on_commit_callbacks(execute=True):
        staff_client.post(_delete_url(by_admin), {"post": "yes"})
        report = tasks.services.conversation_delete(conversation_id=by_service.pk)
    assert admin_preview.removed_counts() == report.removed_counts()
    assert Conversation.objects.count() == 0
    assert Artifact.objects.count() == 0
    assert_no_leftovers()


def test_staff_without_the_delete_permission_cannot_delete_a_conversation(
    client, make_user, shared
):
    from django.contrib.auth.models import Permission

    clerk = make_user(username="clerk", is_staff=True)
    clerk.user_permissions.add(
        Permission.objects.get(codename="view_conversation"),
        Permission.objects.get(codename="change_conversation"),
    )
    client.force_login(clerk)
    assert client.get(_delete_url(shared["first"])).status_code == 403
    assert client.post(_delete_url(shared["first"]), {"post": "yes"}).status_code == 403
    listing = client.get(reverse(CHANGELIST))
    assert b'value="delete_selected"' not in listing.content
    client.post(
        reverse(CHANGELIST),
        {
            "action": "delete_selected",
            "_selected_action": [shared["first"].pk],
            "post": "yes",
        },
    )
    assert Conversation.objects.filter(pk=shared["first"].pk).exists()


def test_a_user_who_is_not_staff_cannot_reach_the_delete_page(
    client, make_user, shared
):
    client.force_login(make_user(username="visitor"))
    response = client.post(_delete_url(shared["first"]), {"post": "yes"})
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert Conversation.objects.filter(pk=shared["first"].pk).exists()
