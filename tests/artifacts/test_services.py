"""artifact_store: blob before row, dedup by sha, payloads never in the DB."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection, models

from artifacts.models import Artifact, ArtifactClass
from artifacts.services import ArtifactError, artifact_store, artifact_verify
from artifacts.store import default_store

MARKER = "PAYLOAD-MARKER-7f3c2b"


@pytest.mark.django_db
def test_storing_the_same_bytes_twice_gives_one_row_and_one_blob(user):
    a = artifact_store(
        owner=user, data=b"abc", media_type="text/plain", artifact_class=2
    )
    b = artifact_store(
        owner=user, data=b"abc", media_type="text/plain", artifact_class=2
    )
    assert a.pk == b.pk
    assert Artifact.objects.count() == 1
    assert len(list(default_store().shas())) == 1


@pytest.mark.django_db
def test_the_blob_exists_before_the_row_points_at_it(monkeypatch, user):
    from artifacts import services

    seen = {}
    real_insert = services.artifact_insert

    def spy(**kwargs):
        seen["blob_on_disk"] = default_store().exists(kwargs["sha256"])
        return real_insert(**kwargs)

    monkeypatch.setattr(services, "artifact_insert", spy)
    artifact_store(
        owner=user, data=b"write before show", media_type="text/plain", artifact_class=3
    )
    assert seen == {"blob_on_disk": True}


@pytest.mark.django_db
@pytest.mark.parametrize("bad", [0, 5, "x", None])
def test_an_invalid_class_is_refused_before_anything_is_written(bad, user):
    with pytest.raises(ArtifactError, match="class must be"):
        artifact_store(
            owner=user, data=b"x", media_type="text/plain", artifact_class=bad
        )
    assert not Artifact.objects.exists()
    assert list(default_store().shas()) == []


@pytest.mark.django_db
def test_source_refs_record_lineage_and_unknown_sources_are_refused(user):
    base = artifact_store(
        owner=user, data=b"closes", media_type="text/csv", artifact_class=2
    )
    chart = artifact_store(
        owner=user,
        data=b"<svg/>",
        media_type="image/svg+xml",
        artifact_class=4,
        source_ids=[base.pk],
    )
    assert list(chart.sources.all()) == [base]
    assert list(base.derived.all()) == [chart]
    with pytest.raises(ArtifactError, match="source"):
        artifact_store(
            owner=user,
            data=b"y",
            media_type="text/plain",
            artifact_class=4,
            source_ids=[99999],
        )


@pytest.mark.django_db
def test_verify_marks_missing_and_corrupt_blobs(user):
    ok = artifact_store(
        owner=user, data=b"fine", media_type="text/plain", artifact_class=1
    )
    gone = artifact_store(
        owner=user, data=b"gone", media_type="text/plain", artifact_class=1
    )
    bad = artifact_store(
        owner=user, data=b"bad", media_type="text/plain", artifact_class=1
    )
    store = default_store()
    store.unlink(gone.sha256)
    path = store.path(bad.sha256)
    path.chmod(0o644)
    path.write_bytes(b"evil")
    assert artifact_verify(artifact=ok) == "ok"
    assert artifact_verify(artifact=gone) == "missing"
    assert artifact_verify(artifact=bad) == "corrupt"
    assert Artifact.objects.get(pk=bad.pk).integrity == "corrupt"


@pytest.mark.django_db
def test_no_column_of_any_table_holds_payload_text(make_task, user):
    """Store a payload with a marker through every write path; scan every text column."""
    from tasks.services import event_append

    payload = (MARKER + " ") * 200
    art = artifact_store(
        owner=user,
        data=payload.encode(),
        media_type="text/plain",
        artifact_class=ArtifactClass.SNAPSHOT,
        title="search results",
    )
    task = make_task()
    event_append(
        task_id=task.pk,
        kind="payload_persisted",
        data={"sha256": art.sha256, "size": art.size},
    )
    hits = []
    with connection.cursor() as cursor:
        for model in apps.get_models():
            text_fields = [
                f.column
                for f in model._meta.concrete_fields
                if isinstance(f, (models.CharField, models.TextField, models.JSONField))
            ]
            table = connection.ops.quote_name(model._meta.db_table)
            for column in text_fields:
                col = connection.ops.quote_name(column)
                cast = f"CAST({col} AS TEXT)"
                cursor.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE {cast} LIKE %s",
                    [f"%{MARKER}%"],
                )
                if cursor.fetchone()[0]:
                    hits.append(f"{model._meta.db_table}.{column}")
    assert hits == []
    assert default_store().get(art.sha256).decode() == payload


@pytest.mark.django_db
def test_a_blob_collected_between_its_write_and_its_row_is_refused_not_half_recorded(
    user,
):
    from artifacts.gc import blobs_unlink
    from artifacts.services import BlobVanished, artifact_record, blob_put

    put = blob_put(data=b"reused bytes")
    # A concurrent GC finds no row naming the sha and unlinks the file.
    assert blobs_unlink(shas=[put.sha256], store=default_store()) == 1
    with pytest.raises(BlobVanished, match="send it again"):
        artifact_record(owner=user, put=put, media_type="text/plain", artifact_class=3)
    assert not Artifact.objects.filter(sha256=put.sha256).exists()


@pytest.mark.django_db
def test_artifact_store_writes_the_bytes_again_when_gc_took_them_meanwhile(
    monkeypatch, user
):
    from artifacts import services
    from artifacts.gc import blobs_unlink

    real_put = services.blob_put
    calls = []

    def put_then_collected(**kwargs):
        result = real_put(**kwargs)
        calls.append(result.sha256)
        if len(calls) == 1:
            blobs_unlink(shas=[result.sha256], store=default_store())
        return result

    monkeypatch.setattr(services, "blob_put", put_then_collected)
    art = artifact_store(
        owner=user, data=b"raced", media_type="text/plain", artifact_class=3
    )
    assert len(calls) == 2
    assert default_store().verify(art.sha256)


def test_reusing_a_stored_blob_refreshes_its_mtime_for_the_doctors_grace_period(
    blob_store,
):
    import os
    import time

    put = blob_store.put_bytes(b"old bytes")
    path = blob_store.path(put.sha256)
    long_ago = time.time() - 86_400
    os.utime(path, (long_ago, long_ago))
    blob_store.put_bytes(b"old bytes")
    assert path.stat().st_mtime > time.time() - 60
