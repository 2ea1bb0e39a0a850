"""conversation_delete: one body, every door, every table and the blob folder."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from artifacts.gc import REASON_SOURCE
from artifacts.models import Artifact, ArtifactClass, PendingUnlink
from artifacts.services import artifact_store
from artifacts.store import BlobStore, default_store
from council.models import CouncilRound, Turn, TurnArtifact
from tasks.doctor import doctor_run
from tasks.models import (
    Conversation,
    DeleteRefused,
    Event,
    Step,
    Task,
    TaskArtifact,
)
from tasks.plan import task_create
from tasks.services import (
    ERR_FOREIGN_KEYS_OFF,
    conversation_delete,
    conversation_deletion_preview,
    events_append,
)
from tasks.tools import files_root
from tests.support.executing import crash_at, expire_lease
from tests.support.leftovers import (
    assert_no_leftovers,
    conversation_with_everything,
    find_leftovers,
    subtree_snapshot,
)

EXPECTED_COUNTS = {
    "conversations": 1,
    "rounds": 1,
    "turns": 2,
    "tasks": 1,
    "steps": 3,
    "events": 6,
    "links": 5,
    "artifacts": 4,
}


@pytest.fixture
def blob_store(any_store):
    """The tests about blobs run on the folder and on a bucket."""
    return any_store


def blob_files(store: BlobStore) -> set[str]:
    return set(store.shas())


class ChangedMyMind(Exception):
    pass


def delete_then_fail(conversation_id: int) -> None:
    """Delete inside a transaction that then fails, as a caller might."""
    with transaction.atomic():
        conversation_delete(conversation_id=conversation_id)
        raise ChangedMyMind


@pytest.mark.django_db
def test_conversation_delete_removes_every_row_of_the_subtree_and_its_blobs(
    user, blob_store, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)
    other, _ = conversation_with_everything(owner=user, title="kept")
    before = subtree_snapshot(conversation.pk)
    kept_blobs = blob_files(blob_store) - {a.sha256 for a in artifacts.values()}

    with django_capture_on_commit_callbacks(execute=True):
        report = conversation_delete(conversation_id=conversation.pk)

    assert report.removed_counts() == EXPECTED_COUNTS
    assert report.total_removed == sum(EXPECTED_COUNTS.values())
    assert {r.title for r in report.removed_artifacts} == {
        "daily closes",
        "chart",
        "widget",
        "widget preview",
    }
    assert report.kept_artifacts == []
    assert_no_leftovers(before)
    assert blob_files(blob_store) == kept_blobs
    assert Conversation.objects.filter(pk=other.pk).exists()
    assert Event.objects.filter(task__conversation=other).count() == 6


@pytest.mark.django_db
def test_preview_gives_the_same_numbers_as_the_delete_and_writes_nothing(
    user, django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)
    shared_task = Task.objects.create(
        conversation=conversation_with_everything(owner=user)[0], title="uses chart"
    )
    TaskArtifact.objects.create(
        task=shared_task, artifact=artifacts["chart"], role="referenced"
    )

    with django_assert_max_num_queries(25):
        preview = conversation_deletion_preview(conversation=conversation)

    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert Artifact.objects.filter(pk=artifacts["png"].pk).exists()
    with django_capture_on_commit_callbacks(execute=True):
        report = conversation_delete(conversation_id=conversation.pk)
    assert preview.removed_counts() == report.removed_counts()
    assert preview.removed_artifacts == report.removed_artifacts
    assert preview.kept_artifacts == report.kept_artifacts


@pytest.mark.django_db
def test_an_artifact_shared_with_another_conversation_is_kept_with_the_reason(
    user, make_conversation, blob_store, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)
    elsewhere = Task.objects.create(
        conversation=make_conversation(owner=user), title="reads the closes"
    )
    TaskArtifact.objects.create(
        task=elsewhere, artifact=artifacts["closes"], role="referenced"
    )
    before = subtree_snapshot(conversation.pk)

    with django_capture_on_commit_callbacks(execute=True):
        report = conversation_delete(conversation_id=conversation.pk)

    assert [(r.title, r.reason) for r in report.kept_artifacts] == [
        (
            "daily closes",
            f"shared with task “{elsewhere.title}” in “{elsewhere.conversation.title}”",
        )
    ]
    assert Artifact.objects.filter(pk=artifacts["closes"].pk).exists()
    assert blob_store.verify(artifacts["closes"].sha256)
    assert not Artifact.objects.filter(pk=artifacts["chart"].pk).exists()
    assert_no_leftovers(before)


@pytest.mark.django_db
def test_a_step_output_or_turn_in_another_conversation_keeps_the_artifact(
    user, make_conversation, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)
    other = make_conversation(owner=user)
    task = Task.objects.create(conversation=other, title="adopts the chart")
    Step.objects.create(
        task=task,
        position=1,
        title="s",
        tool="t",
        status="done",
        output=artifacts["chart"],
    )
    council_round = CouncilRound.objects.create(conversation=other, number=1, topic="t")
    participant = council_round.participants.create(name="grok")
    turn = Turn.objects.create(round=council_round, participant=participant, order=1)
    TurnArtifact.objects.create(turn=turn, artifact=artifacts["png"], role="cited")

    with django_capture_on_commit_callbacks(execute=True):
        report = conversation_delete(conversation_id=conversation.pk)

    reasons = {r.title: r.reason for r in report.kept_artifacts}
    assert reasons == {
        "chart": f"output of a step of task “adopts the chart” in “{other.title}”",
        "widget preview": f"used by council turn {turn.pk} in another conversation",
        # The survivors keep their sources, down the lineage.
        "daily closes": REASON_SOURCE.format(artifact=artifacts["chart"].pk),
        "widget": REASON_SOURCE.format(artifact=artifacts["png"].pk),
    }
    assert report.removed_artifacts == []
    assert_no_leftovers()


@pytest.mark.django_db
def test_an_artifact_named_as_a_source_by_a_survivor_is_kept(
    user, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)
    # A derived artifact made elsewhere, kept by another conversation's task.
    summary = artifact_store(
        owner=user,
        data=b"summary of the closes",
        media_type="text/plain",
        artifact_class=ArtifactClass.RENDER,
        title="summary",
        source_ids=[artifacts["closes"].pk],
    )
    other_task = Task.objects.create(
        conversation=Conversation.objects.create(owner=user, title="o"), title="t"
    )
    TaskArtifact.objects.create(task=other_task, artifact=summary)

    with django_capture_on_commit_callbacks(execute=True):
        report = conversation_delete(conversation_id=conversation.pk)

    assert [(r.title, r.reason) for r in report.kept_artifacts] == [
        ("daily closes", f"named as a source by artifact {summary.pk}")
    ]
    assert_no_leftovers()


@pytest.mark.django_db
def test_a_lineage_chain_is_collected_to_its_fixed_point(
    user, blob_store, django_capture_on_commit_callbacks
):
    """Sources that only the deleted artifacts named go too, however deep."""
    conversation = Conversation.objects.create(owner=user, title="chain")
    chain = []
    for i in range(6):
        chain.append(
            artifact_store(
                owner=user,
                data=f"level {i}".encode(),
                media_type="text/plain",
                artifact_class=ArtifactClass.RENDER,
                source_ids=[chain[-1].pk] if chain else [],
            )
        )
    task = Task.objects.create(conversation=conversation, title="top only")
    TaskArtifact.objects.create(task=task, artifact=chain[-1])

    with django_capture_on_commit_callbacks(execute=True):
        report = conversation_delete(conversation_id=conversation.pk)

    assert sorted(r.id for r in report.removed_artifacts) == [a.pk for a in chain]
    assert not Artifact.objects.exists()
    assert blob_files(blob_store) == set()
    assert_no_leftovers()


@pytest.mark.django_db
def test_a_rollback_leaves_every_row_and_blob_file_in_place(
    user, blob_store, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)
    files_before = blob_files(blob_store)

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(ChangedMyMind),
    ):
        delete_then_fail(conversation.pk)

    assert callbacks == []
    assert blob_files(blob_store) == files_before
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert Artifact.objects.count() == 4
    assert Event.objects.count() == 6
    assert find_leftovers() == []


@pytest.mark.django_db
def test_conversation_model_delete_refuses_and_names_the_service(user):
    conversation, _ = conversation_with_everything(owner=user)
    before = subtree_snapshot(conversation.pk)

    with pytest.raises(DeleteRefused, match="conversation_delete"):
        conversation.delete()

    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert subtree_snapshot(conversation.pk) == before


@pytest.mark.django_db
def test_queryset_delete_refuses_and_deletes_nothing(user, make_user):
    mine = [conversation_with_everything(owner=user)[0] for _ in range(2)]
    conversation_with_everything(owner=make_user())
    before = subtree_snapshot(*[c.pk for c in mine])

    with pytest.raises(DeleteRefused, match="conversation_delete"):
        Conversation.objects.filter(owner=user).delete()

    assert Conversation.objects.count() == 3
    assert subtree_snapshot(*[c.pk for c in mine]) == before


@pytest.mark.django_db
def test_deleting_a_user_deletes_their_conversations_through_the_service(
    make_user, django_capture_on_commit_callbacks
):
    owner, bystander = make_user(), make_user()
    owned = [conversation_with_everything(owner=owner)[0] for _ in range(2)]
    kept, _ = conversation_with_everything(owner=bystander)
    before = subtree_snapshot(*[c.pk for c in owned])

    with django_capture_on_commit_callbacks(execute=True):
        owner.delete()

    assert not get_user_model().objects.filter(pk=owner.pk).exists()
    assert list(Conversation.objects.values_list("pk", flat=True)) == [kept.pk]
    assert_no_leftovers(before)


@pytest.mark.django_db
def test_bulk_deleting_users_deletes_all_their_conversations(
    make_user, django_capture_on_commit_callbacks
):
    users = [make_user(), make_user()]
    owned = [conversation_with_everything(owner=u)[0] for u in users]
    before = subtree_snapshot(*[c.pk for c in owned])

    with django_capture_on_commit_callbacks(execute=True):
        get_user_model().objects.filter(pk__in=[u.pk for u in users]).delete()

    assert not Conversation.objects.exists()
    assert not Artifact.objects.exists()
    assert_no_leftovers(before)


@pytest.mark.django_db
def test_deleting_a_conversation_that_is_already_gone_removes_nothing(user):
    conversation, _ = conversation_with_everything(owner=user)
    missing = conversation.pk + 1000

    report = conversation_delete(conversation_id=missing)

    assert report.total_removed == 0
    assert report.removed_artifacts == report.kept_artifacts == []
    assert Conversation.objects.count() == 1


@pytest.mark.django_db
def test_delete_query_count_does_not_grow_with_events_steps_or_tasks(
    user, django_assert_num_queries
):
    """The cascade runs in the database: no event, step or task row is loaded.
    Both have calls cut off (a ``tool_call_started`` and nothing after it),
    whose blobs a fixed few queries more look for."""
    small, _ = conversation_with_everything(owner=user)
    cut = Task.objects.create(conversation=small, title="cut")
    step = Step.objects.create(task=cut, position=1, title="s", tool="t")
    events_append(task_id=cut.pk, entries=[("tool_call_started", step.pk, {})])
    big, _ = conversation_with_everything(owner=user)
    for n in range(20):
        task = Task.objects.create(conversation=big, title=f"t{n}")
        for pos in range(5):
            step = Step.objects.create(task=task, position=pos, title="s", tool="t")
            events_append(
                task_id=task.pk, entries=[("tool_call_started", step.pk, {})] * 10
            )

    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as small_queries:
        conversation_delete(conversation_id=small.pk)
    with django_assert_num_queries(len(small_queries)):
        report = conversation_delete(conversation_id=big.pk)
    assert report.events == 6 + 20 * 5 * 10


@pytest.mark.django_db
def test_a_failed_blob_unlink_is_logged_not_raised(
    user, blob_store, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    conversation, artifacts = conversation_with_everything(owner=user)

    def refuse(self, sha):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(type(blob_store), "unlink", refuse)
    with (
        caplog.at_level(logging.WARNING, logger="pippa.gc"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        report = conversation_delete(conversation_id=conversation.pk)

    assert report.removed_counts()["artifacts"] == 4
    assert not Artifact.objects.exists()
    assert "could not unlink blob" in caplog.text
    assert blob_files(blob_store) == {a.sha256 for a in artifacts.values()}


# -- committed transactions: the on_commit unlink really runs --------------------


@pytest.mark.django_db(transaction=True)
def test_a_committed_delete_unlinks_blobs_after_the_commit(user, blob_store):
    conversation, artifacts = conversation_with_everything(owner=user)
    other, other_artifacts = conversation_with_everything(owner=user)
    before = subtree_snapshot(conversation.pk)

    conversation_delete(conversation_id=conversation.pk)

    assert_no_leftovers(before)
    assert blob_files(blob_store) == {a.sha256 for a in other_artifacts.values()}


@pytest.mark.django_db(transaction=True)
def test_a_delete_rolled_back_by_a_failing_caller_keeps_the_files(user, blob_store):
    conversation, _ = conversation_with_everything(owner=user)
    files = blob_files(blob_store)

    with pytest.raises(ChangedMyMind):
        delete_then_fail(conversation.pk)

    assert blob_files(blob_store) == files
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    assert_no_leftovers()


def set_foreign_keys(on: bool) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA foreign_keys = {'ON' if on else 'OFF'}")
        else:
            role = "DEFAULT" if on else "replica"
            cursor.execute(f"SET session_replication_role = {role}")


@pytest.mark.django_db(transaction=True)
def test_delete_refuses_to_run_on_a_connection_with_foreign_keys_off(user):
    conversation, _ = conversation_with_everything(owner=user)
    set_foreign_keys(False)
    try:
        with pytest.raises(RuntimeError, match="foreign keys are off"):
            conversation_delete(conversation_id=conversation.pk)
    finally:
        set_foreign_keys(True)
    assert ERR_FOREIGN_KEYS_OFF.startswith("foreign keys are off")
    assert Step.objects.count() == 3
    assert Conversation.objects.filter(pk=conversation.pk).exists()


def delete_at_once(pk: int, barrier, errors: list) -> None:
    """Thread body: wait for the other thread, then delete."""
    from django.db import connections

    try:
        barrier.wait()
        conversation_delete(conversation_id=pk)
    except BaseException as exc:  # reported by the test
        errors.append(exc)
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_deletes_of_conversations_sharing_an_artifact_leave_nothing(
    make_user, make_artifact, blob_store
):
    """Without the lock each delete would see the other's link and keep the
    shared artifact, and it would leak. With it, the second delete removes it."""
    import threading

    for _ in range(4):
        shared = make_artifact()
        owner = make_user()
        conversations = []
        for n in range(2):
            conversation = Conversation.objects.create(owner=owner, title=f"c{n}")
            task = Task.objects.create(conversation=conversation, title="t")
            TaskArtifact.objects.create(task=task, artifact=shared)
            conversations.append(conversation)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=delete_at_once, args=(c.pk, barrier, errors))
            for c in conversations
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert errors == []
        assert not Artifact.objects.filter(pk=shared.pk).exists()
        assert not blob_store.exists(shared.sha256)
        assert_no_leftovers()


# -- what a cut-off call wrote ------------------------------------------------------


def _cut_after_its_blob(conversation) -> tuple[Task, str]:
    """A one-step task whose worker died after writing the step's blob and
    before any event named it; return the task and that blob's sha."""
    store = default_store()
    before = set(store.shas())
    task = task_create(
        conversation=conversation,
        title="fetch",
        steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
    )
    crash_at(task.pk, "after_blob")
    (sha,) = set(store.shas()) - before
    assert not Event.objects.filter(kind="payload_persisted").exists()
    return task, sha


def _a_minute_ago(monkeypatch, conversation) -> tuple[Task, str]:
    """``_cut_after_its_blob``, a minute ago: its events, lease and blob."""
    real_now = timezone.now
    with monkeypatch.context() as clock:
        clock.setattr(timezone, "now", lambda: real_now() - timedelta(minutes=1))
        task, sha = _cut_after_its_blob(conversation)
    then = time.time() - 60
    os.utime(default_store().path(sha), (then, then))
    return task, sha


def _doctor_clean(store) -> None:
    report = doctor_run(grace_seconds=0, store=store)
    assert report.clean, [f.as_dict() for f in report.findings if f.remaining]


@pytest.mark.django_db
def test_deleting_every_demo_conversation_leaves_no_blob_and_a_clean_doctor(
    django_capture_on_commit_callbacks,
):
    """The demo ``make run`` loads holds a search snapshot written and never
    recorded (its step was cut off after its blob): it leaves with its
    conversation, not an hour later with the doctor."""
    call_command("pippa_demo", verbosity=0)
    store = default_store()
    assert set(store.shas())

    for pk in list(Conversation.objects.values_list("pk", flat=True)):
        with django_capture_on_commit_callbacks(execute=True):
            conversation_delete(conversation_id=pk)

    assert set(store.shas()) == set()
    left = {path.relative_to(files_root()) for path in files_root().rglob("*")}
    assert {str(path) for path in left} <= {"outbox.jsonl"}  # the "outside world"
    _doctor_clean(store)


@pytest.mark.django_db
def test_a_blob_a_cut_off_call_wrote_goes_with_its_conversation(
    make_conversation, tool_log, django_capture_on_commit_callbacks
):
    task, sha = _cut_after_its_blob(make_conversation())
    expire_lease(task.pk)

    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=task.conversation_id)

    assert not default_store().exists(sha)
    assert not PendingUnlink.objects.exists()
    _doctor_clean(default_store())


@pytest.mark.django_db
def test_a_blob_a_cut_off_call_wrote_stays_while_another_conversations_row_names_it(
    make_conversation, make_user, tool_log, django_capture_on_commit_callbacks
):
    task, sha = _cut_after_its_blob(make_conversation())
    expire_lease(task.pk)
    other = make_user()
    same_bytes = artifact_store(
        owner=other,
        data=default_store().get(sha),
        media_type="text/plain",
        artifact_class=ArtifactClass.FETCH,
    )
    kept = Task.objects.create(conversation=make_conversation(owner=other), title="k")
    TaskArtifact.objects.create(
        task=kept, artifact=same_bytes, role=TaskArtifact.Role.REFERENCED
    )

    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=task.conversation_id)

    assert same_bytes.sha256 == sha
    assert default_store().verify(sha)
    assert Artifact.objects.filter(pk=same_bytes.pk).exists()
    _doctor_clean(default_store())


@pytest.mark.django_db
def test_a_blob_written_since_another_conversations_live_call_began_stays(
    make_conversation, tool_log, django_capture_on_commit_callbacks, monkeypatch
):
    """Another conversation's call, its lease alive, may not have named its
    blob yet: the delete leaves it (the doctor's grace period covers it)."""
    gone, gone_sha = _a_minute_ago(monkeypatch, make_conversation())
    busy, busy_sha = _cut_after_its_blob(make_conversation())  # lease still live

    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=gone.conversation_id)

    assert not default_store().exists(gone_sha)
    assert default_store().verify(busy_sha)
