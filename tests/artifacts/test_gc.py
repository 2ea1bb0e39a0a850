"""artifacts.gc: the artifact rule on its own, the whole-table sweep, blob unlinks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from artifacts.gc import (
    BATCH,
    ArtifactRecord,
    artifacts_delete,
    blobs_unlink,
    gc_plan,
    unowned_artifacts,
)
from artifacts.models import Artifact, ArtifactSource
from artifacts.services import artifact_store
from tasks.keeping import REASON_DANGLING
from tasks.models import TaskArtifact


@pytest.fixture
def blob_store(any_store):
    """The tests about blobs run on the folder and on a bucket."""
    return any_store


@pytest.mark.django_db
def test_gc_plan_removes_a_cycle_that_nothing_outside_keeps(make_artifact):
    a, b = make_artifact(), make_artifact(source_ids=[])
    ArtifactSource.objects.create(artifact=a, source=b)
    ArtifactSource.objects.create(artifact=b, source=a)

    plan = gc_plan(candidate_ids=[a.pk])

    assert sorted(r.id for r in plan.remove) == sorted([a.pk, b.pk])
    assert plan.keep == []


@pytest.mark.django_db
def test_gc_plan_keeps_a_whole_cycle_when_one_member_is_linked(
    make_artifact, make_task
):
    a, b, c = make_artifact(), make_artifact(), make_artifact()
    ArtifactSource.objects.create(artifact=a, source=b)
    ArtifactSource.objects.create(artifact=b, source=c)
    ArtifactSource.objects.create(artifact=c, source=a)
    task = make_task()
    TaskArtifact.objects.create(task=task, artifact=b)

    plan = gc_plan(candidate_ids=[a.pk])

    assert plan.remove == []
    assert {r.id: r.reason for r in plan.keep} == {
        a.pk: f"named as a source by artifact {c.pk}",
        b.pk: f"shared with task “{task.title}” in “{task.conversation.title}”",
        c.pk: f"named as a source by artifact {b.pk}",
    }


@pytest.mark.django_db
def test_gc_plan_writes_nothing(make_artifact):
    a = make_artifact()

    with CaptureQueriesContext(connection) as queries:
        gc_plan(candidate_ids=[a.pk])

    assert all(q["sql"].lstrip().upper().startswith("SELECT") for q in queries)
    assert Artifact.objects.filter(pk=a.pk).exists()


@pytest.mark.django_db
def test_gc_plan_batches_its_in_lists_for_many_candidates(make_task):
    """Over BATCH candidates take several IN lists, never one per artifact."""
    n = BATCH * 2 + 7
    task = make_task()
    rows = Artifact.objects.bulk_create(
        [
            Artifact(owner=task.conversation.owner, sha256=f"{i:064x}", size=0)
            for i in range(n)
        ]
    )
    TaskArtifact.objects.bulk_create(
        [TaskArtifact(task=task, artifact=a) for a in rows[::2]]
    )

    with CaptureQueriesContext(connection) as queries:
        plan = gc_plan(candidate_ids=[a.pk for a in rows])

    assert len(plan.remove) == n // 2
    assert len(plan.keep) == n - n // 2
    assert len(queries) <= 8 * 3 + 2
    longest = max(q["sql"].count("%s") + q["sql"].count("?") for q in queries)
    assert longest <= BATCH


@pytest.mark.django_db
def test_a_link_whose_task_is_gone_keeps_the_artifact_and_says_so(make_artifact):
    """The old bug's dangling link: the schema would refuse the delete anyway."""
    artifact = make_artifact()
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA defer_foreign_keys = ON")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        cursor.execute(
            "INSERT INTO tasks_taskartifact (artifact_id, task_id, role, created_at) "
            "VALUES (%s, %s, 'persisted', %s)",
            [
                artifact.pk,
                999_999,
                connection.ops.adapt_datetimefield_value(timezone.now()),
            ],
        )

    plan = gc_plan(candidate_ids=[artifact.pk])

    assert [(r.id, r.reason) for r in plan.keep] == [
        (artifact.pk, REASON_DANGLING.format(task=999_999))
    ]
    with connection.cursor() as cursor:  # leave the test transaction consistent
        cursor.execute("DELETE FROM tasks_taskartifact WHERE task_id = 999999")


@pytest.mark.django_db
def test_unowned_artifacts_skips_young_ones_and_follows_lineage(
    make_artifact, make_task
):
    kept_source = make_artifact()
    kept = make_artifact(source_ids=[kept_source.pk])
    TaskArtifact.objects.create(task=make_task(), artifact=kept)
    lost_source = make_artifact()
    lost = make_artifact(source_ids=[lost_source.pk])

    assert unowned_artifacts(created_before=timezone.now() - timedelta(hours=1)) == []
    later = timezone.now() + timedelta(seconds=1)
    assert unowned_artifacts(created_before=later) == [
        (lost_source.pk, lost_source.sha256),
        (lost.pk, lost.sha256),
    ]


@pytest.mark.django_db
def test_blobs_unlink_spares_a_sha_stored_again_meanwhile(blob_store, make_artifact):
    """Between the commit and the unlink the same bytes may have been stored
    again: the unlink re-checks the rows and leaves that file alone."""
    gone = make_artifact(data=b"gone for good")
    back = make_artifact(data=b"stored again")
    shas = [gone.sha256, back.sha256]
    Artifact.objects.filter(pk=gone.pk).delete()
    Artifact.objects.filter(pk=back.pk).delete()
    artifact_store(
        owner=gone.owner,
        data=b"stored again",
        media_type="text/plain",
        artifact_class=3,
    )

    removed = blobs_unlink(shas=shas, store=blob_store)

    assert removed == 1
    assert not blob_store.exists(gone.sha256)
    assert blob_store.verify(back.sha256)


@pytest.mark.django_db
def test_artifacts_delete_defers_the_unlink_to_the_commit(
    blob_store, make_artifact, django_capture_on_commit_callbacks
):
    artifact = make_artifact()
    record = ArtifactRecord(artifact.pk, artifact.sha256, "", 3)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        deleted = artifacts_delete(records=[record], store=blob_store)
        assert blob_store.exists(artifact.sha256)  # not before the commit

    assert deleted == 1
    assert len(callbacks) == 1
    callbacks[0]()
    assert not blob_store.exists(artifact.sha256)
