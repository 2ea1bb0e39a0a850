"""The migration that makes every payload a file: run on a database that holds
inline rows (the small outputs the inline store kept in the database)."""

from __future__ import annotations

import hashlib
import stat

import pytest
from django.db import connection
from django.utils import timezone

from artifacts.models import Artifact
from artifacts.store import FolderStore
from tests.support.migrating import migrate_back, migrate_forward

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("artifacts", "0006_inline_blob")
TABLE = "artifacts_inlineblob"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tables() -> set[str]:
    return set(connection.introspection.table_names())


def test_every_inline_row_becomes_a_verified_private_file_and_the_table_goes(
    settings, make_user
):
    apps = migrate_back(BEFORE)
    assert TABLE in _tables()
    InlineBlob = apps.get_model("artifacts", "InlineBlob")
    HistoricalArtifact = apps.get_model("artifacts", "Artifact")
    owner = make_user(username="inline-owner")
    outputs = [b"a small search result", b"\x00binary\xff bytes", b"x" * 16384]
    for data in outputs:
        InlineBlob.objects.create(
            sha256=_sha(data), size=len(data), data=data, created_at=timezone.now()
        )
        HistoricalArtifact.objects.create(
            owner_id=owner.pk, sha256=_sha(data), size=len(data), integrity="ok"
        )
    # One of them is already a file (written before the inline store): kept.
    store = FolderStore(settings.BLOB_DIR)
    already = store.put_bytes(outputs[0])

    migrate_forward()

    assert TABLE not in _tables()
    for data in outputs:
        path = store.path(_sha(data))
        assert path.read_bytes() == data
        assert store.verify(_sha(data))
        assert stat.S_IMODE(path.stat().st_mode) == 0o400
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert store.path(already.sha256).read_bytes() == outputs[0]
    assert not list(store.iter_temp_files())
    # Every artifact row's bytes are a file whose sha matches.
    assert all(store.verify(a.sha256) for a in Artifact.objects.all())
    assert Artifact.objects.count() == len(outputs)


def test_an_inline_row_that_fails_its_sha_stops_the_migration_and_drops_nothing(
    settings,
):
    apps = migrate_back(BEFORE)
    InlineBlob = apps.get_model("artifacts", "InlineBlob")
    good, bad = b"intact bytes", b"rotted bytes"
    InlineBlob.objects.create(
        sha256=_sha(good), size=len(good), data=good, created_at=timezone.now()
    )
    InlineBlob.objects.create(
        sha256=_sha(b"what it was"), size=len(bad), data=bad, created_at=timezone.now()
    )
    with pytest.raises(RuntimeError, match="does not hash to its sha"):
        migrate_forward()
    assert TABLE in _tables()
    assert InlineBlob.objects.count() == 2
    # Put things back for the next test: the rotted row goes, then forward.
    InlineBlob.objects.filter(sha256=_sha(b"what it was")).delete()
    migrate_forward()
    assert TABLE not in _tables()
    assert FolderStore(settings.BLOB_DIR).path(_sha(good)).read_bytes() == good
