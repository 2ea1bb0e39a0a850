"""Writes of artifacts: blob first, then the row that points at it.

Every write is counted against its owner's storage quota (``artifacts.quota``)
before its bytes are named in the store, and again in the row's transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from django.db import connection, transaction
from django.utils import timezone

from artifacts.gc import blob_guard, blob_guard_key, blobs_unlink_after_commit
from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from artifacts.quota import QuotaExceeded, quota_admit, quota_enforce
from artifacts.store import (
    Admit,
    BlobStore,
    PutResult,
    check_sha,
    default_store,
)
from pippa_site.errors import Invalid
from pippa_site.text import TITLE_MAX, media_type_clean, title_clean

# Quoted the same way by both engines' quote_name.
T_ARTIFACT = f'"{Artifact._meta.db_table}"'
T_SOURCE = f'"{ArtifactSource._meta.db_table}"'

ERR_BAD_CLASS = "artifact class must be 1, 2, 3 or 4"
ERR_UNKNOWN_SOURCE = "a source artifact does not exist"
ERR_BLOB_VANISHED = "the payload was removed while it was being stored; send it again"
ERR_META_TOO_LARGE = "artifact metadata must stay small (under 8 KiB of JSON)"
MAX_META_CHARS = 8192
# An artifact names at most this many sources: every door refuses more, and a
# tool's result keeps its first ones.
MAX_SOURCES = 50


class ArtifactError(Invalid):
    """Bytes or a row that cannot be stored as asked (400 at the API)."""


class BlobVanished(ArtifactError):
    """The blob was collected between its write and its row: write it again."""


_CLASSES = frozenset(int(c) for c in ArtifactClass)


def _check_class(artifact_class: int) -> int:
    if type(artifact_class) is int and artifact_class in _CLASSES:
        return artifact_class
    try:
        return ArtifactClass(int(artifact_class)).value
    except (TypeError, ValueError):
        raise ArtifactError(ERR_BAD_CLASS) from None


def blob_put(
    *,
    data: bytes | None = None,
    stream: Iterable[bytes] | None = None,
    file: BinaryIO | None = None,
    max_bytes: int | None = None,
    expected_size: int | None = None,
    owner_id: int | None = None,
    store: BlobStore | None = None,
) -> PutResult:
    """Write payload bytes to the blob store (exactly one of data/stream/file).

    With ``owner_id``, the owner's quota admits the bytes once they are
    hashed and before they are named (``QuotaExceeded`` leaves nothing).
    """
    store = store or default_store()
    if sum(x is not None for x in (data, stream, file)) != 1:
        raise TypeError("pass exactly one of data=, stream=, file=")
    admit: Admit | None = quota_admit(owner_id) if owner_id is not None else None
    if data is not None:
        return store.put_bytes(data, admit=admit)
    if file is not None:
        return store.put_file(file, max_bytes=max_bytes, admit=admit)
    return store.put_stream(
        stream, max_bytes=max_bytes, expected_size=expected_size, admit=admit
    )


def blob_put_refused(*, sha256: str) -> None:
    """A blob written whose row the quota then refused (a writer racing past
    the first check): named by nothing, it goes through the pending-unlink
    record at once, unlinked unless a row of any owner names it."""
    with transaction.atomic():
        blobs_unlink_after_commit(shas=[sha256])


@dataclass(frozen=True)
class Inserted:
    id: int
    created: bool


def _owner_pk(owner) -> int:
    pk = getattr(owner, "pk", owner)
    if pk is None:
        raise TypeError("an artifact needs an owner (a saved user or a user id)")
    return int(pk)


def sources_check(*, owner_id: int, source_ids: Iterable[int]) -> list[int]:
    """Return the distinct source ids, all of them the owner's rows.

    A source that is another owner's row is refused exactly like one that
    does not exist: lineage never joins two owners, and the error tells
    nothing about other people's ids.
    """
    try:
        ids = [int(s) for s in dict.fromkeys(source_ids)]
    except (TypeError, ValueError):
        raise ArtifactError(ERR_UNKNOWN_SOURCE) from None
    if ids:
        found = Artifact.objects.filter(pk__in=ids, owner_id=owner_id).count()
        if found != len(ids):
            raise ArtifactError(ERR_UNKNOWN_SOURCE)
    return ids


def artifact_insert(
    *,
    owner_id: int,
    sha256: str,
    size: int,
    media_type: str,
    artifact_class: int,
    title: str = "",
    meta: dict | None = None,
    source_ids: Sequence[int] = (),
) -> Inserted:
    """Create (or find) the owner's row for a blob already stored: the one
    writer of artifact rows, for the executor, the API, the council, previews,
    the admin and the demo alike.

    A media type that is not ``type/subtype`` is stored as
    application/octet-stream (``media_type_clean``; the doors refuse one
    first with ``media_type_check``).

    The rule for bytes already stored: **for this owner**, the existing row is
    reused as it is (its title, media type, class and meta stand) and only
    the new lineage edges are added; another owner's row over the same blob is
    never touched, read or linked. Every source must be the owner's row.

    Runs inside the caller's transaction when there is one (the executor's
    result commit: ``atomic(savepoint=False)``, a few plain statements),
    under the per-sha ``blob_guard`` so a GC cannot unlink the blob before
    this row commits. A new row past the owner's quota raises
    ``QuotaExceeded`` (``artifacts.quota.quota_enforce``), which rolls the
    caller's transaction back.
    """
    artifact_class = _check_class(artifact_class)
    meta = meta or {}
    meta_json = json.dumps(meta, default=str)
    if len(meta_json) > MAX_META_CHARS:
        raise ArtifactError(ERR_META_TOO_LARGE)
    check_sha(sha256)
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    postgresql = connection.vendor == "postgresql"
    table, edges = T_ARTIFACT, T_SOURCE
    json_mark = "CAST(%s AS jsonb)" if postgresql else "%s"
    values = [
        owner_id,
        sha256,
        size,
        media_type_clean(media_type),
        artifact_class,
        title_clean(title)[:TITLE_MAX],
        meta_json,
        Artifact.Integrity.OK,
        now,
        now,
    ]
    columns = (
        f"INSERT INTO {table} (owner_id, sha256, size, media_type, "
        f"artifact_class, title, meta, integrity, verified_at, created_at) "
    )
    if postgresql:
        # blob_guard's advisory lock, taken by the INSERT itself (one
        # statement fewer on the executor's hot path).
        insert = (
            columns + "SELECT %s, %s, %s, %s, %s, %s, CAST(%s AS jsonb), %s, %s, %s "
            "FROM (SELECT pg_advisory_xact_lock(%s)) AS guard "
        )
        values.append(blob_guard_key(sha256))
    else:  # SQLite: BEGIN IMMEDIATE already holds the write lock (blob_guard)
        insert = columns + f"VALUES (%s, %s, %s, %s, %s, %s, {json_mark}, %s, %s, %s) "
    store = default_store()
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        # GC unlinks a blob only under the same guard after re-checking that no
        # row names it, so a blob seen here, after the guard, stays until this
        # row commits; a vanished one rolls the caller's transaction back. A
        # bucket's check is a round trip: made before the INSERT, whose
        # trigger locks the owner's count row until the commit.
        if store.remote:
            blob_guard(sha256)
            if not store.exists(sha256):
                raise BlobVanished(ERR_BLOB_VANISHED)
        cursor.execute(
            insert + "ON CONFLICT (owner_id, sha256) DO NOTHING RETURNING id", values
        )
        row = cursor.fetchone()
        created = row is not None
        if created:  # the schema's trigger has counted it: within the quota?
            quota_enforce(cursor, owner_id=owner_id, size=size)
        if not store.remote and not store.exists(sha256):
            raise BlobVanished(ERR_BLOB_VANISHED)
        if not created:
            cursor.execute(
                f"SELECT id FROM {table} WHERE owner_id = %s AND sha256 = %s",
                [owner_id, sha256],
            )
            row = cursor.fetchone()
        pk = row[0]
        sources = [
            s
            for s in sources_check(owner_id=owner_id, source_ids=source_ids)
            if s != pk
        ]
        if sources:
            cursor.execute(
                f"INSERT INTO {edges} (artifact_id, source_id, position) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(sources))
                + " ON CONFLICT (artifact_id, source_id) DO NOTHING",
                [x for i, sid in enumerate(sources) for x in (pk, sid, i)],
            )
    return Inserted(id=pk, created=created)


def artifact_record(
    *,
    owner,
    put: PutResult,
    media_type: str,
    artifact_class: int,
    title: str = "",
    meta: dict | None = None,
    source_ids: Sequence[int] = (),
) -> Artifact:
    """Return the owner's row for a blob already on disk (``artifact_insert``)."""
    with transaction.atomic():
        inserted = artifact_insert(
            owner_id=_owner_pk(owner),
            sha256=put.sha256,
            size=put.size,
            media_type=media_type,
            artifact_class=artifact_class,
            title=title,
            meta=meta,
            source_ids=source_ids,
        )
        artifact = Artifact.objects.get(pk=inserted.id)
    artifact._created = inserted.created  # for callers that log dedup
    return artifact


def artifact_store(
    *,
    owner,
    data: bytes | None = None,
    stream: Iterable[bytes] | None = None,
    file: BinaryIO | None = None,
    media_type: str,
    artifact_class: int,
    title: str = "",
    meta: dict | None = None,
    source_ids: Sequence[int] = (),
    max_bytes: int | None = None,
) -> Artifact:
    """Store payload bytes and their artifact row: write before show.

    1. Validate what can be validated before any I/O.
    2. Write the blob (durably stored under its sha), once the owner's quota
       admitted it.
    3. Create or find the owner's row. A crash between 2 and 3 leaves an
       unreferenced blob, which the doctor sweeps after its grace period.
    """
    _check_class(artifact_class)
    owner = _owner_pk(owner)
    put = blob_put(
        data=data, stream=stream, file=file, max_bytes=max_bytes, owner_id=owner
    )
    record = functools.partial(
        artifact_record,
        owner=owner,
        media_type=media_type,
        artifact_class=artifact_class,
        title=title,
        meta=meta,
        source_ids=source_ids,
    )
    try:
        return record(put=put)
    except QuotaExceeded:
        blob_put_refused(sha256=put.sha256)
        raise
    except BlobVanished:
        if data is None:
            raise  # a stream cannot be replayed; the caller sends it again
        return record(put=blob_put(data=data, owner_id=owner))


def artifact_verify(*, artifact: Artifact, store: BlobStore | None = None) -> str:
    """Check an artifact's blob against its sha; record and return the integrity."""
    store = store or default_store()
    if not store.exists(artifact.sha256):
        integrity = Artifact.Integrity.MISSING
    elif store.verify(artifact.sha256):
        integrity = Artifact.Integrity.OK
    else:
        integrity = Artifact.Integrity.CORRUPT
    Artifact.objects.filter(pk=artifact.pk).update(
        integrity=integrity, verified_at=timezone.now()
    )
    artifact.integrity = integrity
    return integrity
