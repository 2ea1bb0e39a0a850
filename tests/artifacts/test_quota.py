"""A storage quota per user: refused at every door before the bytes are
stored, with the quota and the usage in the words; nothing of a refused
payload remains; another user is never affected; counted per row."""

from __future__ import annotations

import hashlib

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.urls import reverse

from artifacts.models import Artifact, StorageQuota
from artifacts.quota import (
    REASON_QUOTA,
    QuotaExceeded,
    quota_usage,
    size_words,
)
from artifacts.services import artifact_store
from tasks.executor import step
from tasks.models import Conversation, Event, Step, Task, TaskArtifact
from tasks.plan import task_create
from tasks.services import conversation_delete
from tests.support.executing import invocations

KB = 1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored_shas() -> set[str]:
    from artifacts.store import default_store

    return set(default_store().shas())


def used(user) -> int:
    return quota_usage(owner_id=user.pk).used


def summed(user) -> int:
    """The truth the schema's count must match: the sizes of the user's rows."""
    return sum(Artifact.objects.filter(owner=user).values_list("size", flat=True))


@pytest.fixture
def alice(make_user):
    return make_user(username="alice")


@pytest.fixture
def bob(make_user):
    return make_user(username="bob")


def fill(user, size: int, tag: str = "x") -> Artifact:
    return artifact_store(
        owner=user,
        data=(tag * size).encode()[:size],
        media_type="text/plain",
        artifact_class=3,
        title=f"{tag} filler",
    )


# -- the count ---------------------------------------------------------------------


@pytest.mark.django_db
def test_the_schema_counts_each_row_of_a_user_whoever_else_stored_the_same_bytes(
    alice, bob
):
    shared = b"the same bytes" * 100
    artifact_store(owner=alice, data=shared, media_type="text/plain", artifact_class=2)
    artifact_store(owner=bob, data=shared, media_type="text/plain", artifact_class=2)
    artifact_store(owner=alice, data=shared, media_type="text/plain", artifact_class=3)
    fill(alice, 500)

    assert used(alice) == summed(alice) == len(shared) + 500
    assert used(bob) == summed(bob) == len(shared)
    assert len(stored_shas()) == 2  # one file per sha, counted per owner


@pytest.mark.django_db(transaction=True)
def test_deleting_a_conversation_frees_exactly_what_its_artifacts_counted(alice, bob):
    kept = fill(alice, 300, "k")
    conversation = Conversation.objects.create(owner=alice, title="goes")
    task = Task.objects.create(conversation=conversation, title="t")
    gone = [fill(alice, 100 + n, f"g{n}") for n in range(3)]
    for artifact in gone:
        TaskArtifact.objects.create(task=task, artifact=artifact)
    TaskArtifact.objects.create(
        task=Task.objects.create(
            conversation=Conversation.objects.create(owner=alice, title="stays"),
            title="t",
        ),
        artifact=kept,
    )
    fill(bob, 700, "b")
    assert used(alice) == 300 + 100 + 101 + 102

    conversation_delete(conversation_id=conversation.pk)

    assert used(alice) == summed(alice) == 300
    assert used(bob) == 700
    assert not stored_shas() & {a.sha256 for a in gone}


# -- every door refuses before the bytes are stored -----------------------------------


@pytest.mark.django_db
def test_a_user_over_quota_is_refused_with_the_quota_and_usage_and_nothing_remains(
    alice, bob, settings
):
    settings.PIPPA_QUOTA_BYTES = 2 * KB
    fill(alice, 1500)
    before = stored_shas()
    payload = b"y" * 800

    with pytest.raises(QuotaExceeded) as refused:
        artifact_store(
            owner=alice, data=payload, media_type="text/plain", artifact_class=3
        )

    words = str(refused.value)
    assert words.startswith(REASON_QUOTA)
    assert size_words(2 * KB) in words  # the quota
    assert size_words(1500) in words  # the usage
    assert size_words(800) in words  # what was asked
    assert refused.value.status == 413
    assert refused.value.code == "quota_exceeded"
    assert stored_shas() == before
    assert not Artifact.objects.filter(sha256=sha(payload)).exists()
    # Bob, under his own quota, stores the very same bytes.
    artifact_store(owner=bob, data=payload, media_type="text/plain", artifact_class=3)
    assert used(bob) == 800
    assert used(alice) == 1500


@pytest.mark.django_db
def test_bytes_already_stored_add_nothing_and_are_never_refused(alice, settings):
    settings.PIPPA_QUOTA_BYTES = 2 * KB
    first = fill(alice, 2 * KB)  # exactly full

    again = fill(alice, 2 * KB)

    assert again.pk == first.pk
    assert used(alice) == 2 * KB


def own_quota(user, limit_bytes: int | None) -> None:
    """What staff set in the admin: the user's own limit (None: the site's;
    0: no limit)."""
    StorageQuota.objects.update_or_create(
        owner=user, defaults={"limit_bytes": limit_bytes}
    )


@pytest.mark.django_db
def test_a_users_own_quota_beats_the_sites_and_zero_means_no_limit(
    alice, bob, settings
):
    settings.PIPPA_QUOTA_BYTES = 1 * KB
    fill(alice, 900)
    own_quota(alice, 10 * KB)
    fill(alice, 5 * KB, "big")
    own_quota(bob, 0)
    fill(bob, 50 * KB, "bigger")

    assert quota_usage(owner_id=alice.pk).limit == 10 * KB
    assert not quota_usage(owner_id=bob.pk).limited
    own_quota(alice, None)
    with pytest.raises(QuotaExceeded):
        fill(alice, 10, "z")


@pytest.mark.django_db
def test_a_writer_racing_past_the_first_check_is_refused_at_its_row_and_its_blob_goes(
    alice, settings, monkeypatch, django_capture_on_commit_callbacks
):
    """Two uploads at once both pass the check before the store; the count
    the row's trigger raised refuses the second inside its transaction, and
    the blob it wrote is unlinked through the pending-unlink record."""
    from artifacts import services

    settings.PIPPA_QUOTA_BYTES = 2 * KB
    fill(alice, 1500)
    monkeypatch.setattr(services, "quota_admit", lambda owner_id: None)
    payload = b"r" * 800

    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(QuotaExceeded) as refused,
    ):
        artifact_store(
            owner=alice, data=payload, media_type="text/plain", artifact_class=3
        )

    assert size_words(1500) in str(refused.value)
    assert sha(payload) not in stored_shas()
    assert used(alice) == summed(alice) == 1500


@pytest.mark.django_db
def test_the_api_refuses_an_upload_over_quota_with_413_and_keeps_nothing(
    client, alice, bob, settings
):
    from api.services import token_create
    from tests.api.conftest import ApiClient, new_task

    def make_api_client(user):
        return ApiClient(client, token_create(user=user, name="runner").raw)

    settings.PIPPA_QUOTA_BYTES = 2 * KB
    fill(alice, 1800)
    alices, bobs = make_api_client(alice), make_api_client(bob)
    task_a, task_b = new_task(alices), new_task(bobs)
    before = stored_shas()
    body = b"u" * 600

    refused = alices.upload(
        f"/api/v1/tasks/{task_a['id']}/artifacts?artifact_class=3", body
    )
    taken = bobs.upload(
        f"/api/v1/tasks/{task_b['id']}/artifacts?artifact_class=3", body
    )

    assert refused.status_code == 413
    answer = refused.json()
    assert answer["code"] == "quota_exceeded"
    assert size_words(2 * KB) in answer["detail"]
    assert size_words(1800) in answer["detail"]
    assert taken.status_code == 201
    assert stored_shas() == before | {sha(body)}
    assert not Artifact.objects.filter(owner=alice, sha256=sha(body)).exists()


@pytest.mark.django_db
def test_mcp_artifact_store_refuses_over_quota_with_the_quota_and_usage(
    alice, bob, settings, tool_log
):
    from mcp.server.mcpserver.exceptions import ToolError

    from pippa_mcp import server
    from pippa_mcp.server import acting_as

    settings.PIPPA_QUOTA_BYTES = 2 * KB
    fill(alice, 1900)
    steps = [{"title": "note", "tool": "test.fetch", "args": {}}]
    tasks = {
        user: task_create(
            conversation=Conversation.objects.create(owner=user, title="c"),
            title="t",
            steps=steps,
        )
        for user in (alice, bob)
    }
    before = stored_shas()

    with acting_as(alice), pytest.raises(ToolError) as refused:
        server.artifact_store(
            task_id=tasks[alice].pk, content="m" * 300, artifact_class=3
        )
    with acting_as(bob):
        stored = server.artifact_store(
            task_id=tasks[bob].pk, content="m" * 300, artifact_class=3
        )

    assert REASON_QUOTA in str(refused.value)
    assert size_words(1900) in str(refused.value)
    assert stored["size"] == 300
    assert stored_shas() == before | {sha(b"m" * 300)}
    assert not Artifact.objects.filter(owner=alice, size=300).exists()


@pytest.mark.django_db
def test_the_dashboard_upload_attaches_a_file_and_refuses_one_over_quota(
    client, alice, bob, settings
):
    settings.PIPPA_QUOTA_BYTES = 2 * KB
    task = Task.objects.create(
        conversation=Conversation.objects.create(owner=alice, title="c"), title="t"
    )
    url = reverse("dashboard:task_upload", args=[task.pk])
    client.force_login(alice)

    page = client.get(task.get_absolute_url())
    assert b"Attach a file" in page.content
    attached = client.post(
        url,
        {"file": SimpleUploadedFile("notes.txt", b"n" * 1500, "text/plain")},
        follow=True,
    )
    assert "Attached “notes.txt”" in attached.content.decode()
    assert TaskArtifact.objects.filter(task=task, artifact__size=1500).exists()

    before = stored_shas()
    refused = client.post(
        url,
        {"file": SimpleUploadedFile("big.txt", b"b" * 900, "text/plain")},
        follow=True,
    )
    text = refused.content.decode()
    assert REASON_QUOTA in text
    assert size_words(2 * KB) in text
    assert size_words(1500) in text
    assert stored_shas() == before
    assert used(alice) == 1500

    # Bob can neither attach to Alice's task nor see the form on it.
    client.force_login(bob)
    assert (
        client.post(
            url, {"file": SimpleUploadedFile("x.txt", b"x", "text/plain")}
        ).status_code
        == 404
    )
    assert not Artifact.objects.filter(owner=bob).exists()


@pytest.mark.django_db
def test_the_settings_page_shows_the_users_own_storage_and_quota(
    client, alice, bob, settings
):
    settings.PIPPA_QUOTA_BYTES = 10 * KB
    fill(alice, 2500)
    fill(bob, 7000)
    client.force_login(alice)

    page = client.get(reverse("tokens:list")).content.decode()

    assert "Storage" in page
    assert f"{size_words(2500).replace(' ', '&nbsp;')}" in page.replace(
        "\xa0", "&nbsp;"
    )
    assert "25%" in page
    assert size_words(7000).replace(" ", "\xa0") not in page  # Bob's is his own


# -- the executor: a step whose output would not fit waits for a person ----------------


@pytest.mark.django_db
def test_a_step_whose_output_is_over_quota_waits_for_a_person_and_stores_nothing(
    make_conversation, alice, tool_log, settings
):
    settings.PIPPA_QUOTA_BYTES = 2 * KB
    fill(alice, 1800)
    task = task_create(
        conversation=make_conversation(owner=alice),
        title="fetch",
        steps=[{"title": "fetch", "tool": "test.fetch", "args": {"size": 1024}}],
    )
    before = stored_shas()

    outcome = step(task_id=task.pk, worker_id="w")

    fetch = Step.objects.get(task=task)
    assert outcome.status == fetch.status == Step.Status.NEEDS_REVIEW
    assert Task.objects.get(pk=task.pk).status == Task.Status.NEEDS_REVIEW
    assert REASON_QUOTA in fetch.error
    assert size_words(1800) in fetch.error
    rule = Event.objects.get(step=fetch, kind="uncertain_resolved").data["rule"]
    assert rule == "quota_review"
    assert invocations(tool_log)[fetch.pk] == 1
    assert stored_shas() == before
    # No worker calls the tool again by itself.
    step(task_id=task.pk, worker_id="w2")
    assert Step.objects.get(pk=fetch.pk).status == Step.Status.NEEDS_REVIEW
    assert invocations(tool_log)[fetch.pk] == 1


@pytest.mark.django_db
def test_the_count_is_kept_by_triggers_on_the_artifact_table(alice):
    """Any path that inserts or deletes a row moves the count: raw SQL too."""
    fill(alice, 400)
    table = Artifact._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE owner_id = %s", [alice.pk])
    assert StorageQuota.objects.get(owner=alice).used_bytes == 0
