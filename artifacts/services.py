"""Writes of artifacts: blob first, then the row that points at it."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import BinaryIO

from django.db import connection, transaction
from django.utils import timezone

from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from artifacts.store import BlobStore, PutResult, check_sha, default_store
from pippa_site.errors import Invalid

ERR_BAD_CLASS = "artifact class must be 1, 2, 3 or 4"
ERR_UNKNOWN_SOURCE = "a source artifact does not exist"
ERR_BLOB_VANISHED = "the payload was removed while it was being stored; send it again"
ERR_META_TOO_LARGE = "artifact metadata must stay small (under 8 KiB of JSON)"
MAX_META_CHARS = 8192


class ArtifactError(Invalid):
    """Bytes or a row that cannot be stored as asked (400 at the API)."""


class BlobVanished(ArtifactError):
    """The blob was collected between its write and its row: write it again."""


def blob_guard(sha: str) -> None:
    """Serialise "create a row for this blob" with "unlink this unnamed blob".

    Call inside a transaction. SQLite's IMMEDIATE transactions already hold
    the database's write lock; PostgreSQL takes a transaction-scoped advisory
    lock keyed by the sha.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [blob_guard_key(sha)])


def blob_guard_key(sha: str) -> int:
    """The advisory lock's key for a sha (PostgreSQL), for ``blob_guard`` and
    the executor's artifact INSERT that takes the same lock in its FROM."""
    return int(sha[:15], 16)


def _check_class(artifact_class: int) -> int:
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
    store: BlobStore | None = None,
) -> PutResult:
    """Write payload bytes to the blob store (exactly one of data/stream/file)."""
    store = store or default_store()
    if sum(x is not None for x in (data, stream, file)) != 1:
        raise TypeError("pass exactly one of data=, stream=, file=")
    if data is not None:
        return store.put_bytes(data)
    if file is not None:
        return store.put_file(file, max_bytes=max_bytes)
    return store.put_stream(stream, max_bytes=max_bytes)


def artifact_record(
    *,
    put: PutResult,
    media_type: str,
    artifact_class: int,
    title: str = "",
    meta: dict | None = None,
    source_ids: Sequence[int] = (),
) -> Artifact:
    """Create (or find, by sha) the row for a blob that is already on disk.

    Content addressing dedups: the same bytes stored twice give one row, and
    the first writer's class and title stand.
    """

    artifact_class = _check_class(artifact_class)
    meta = meta or {}
    if len(json.dumps(meta, default=str)) > MAX_META_CHARS:
        raise ArtifactError(ERR_META_TOO_LARGE)
    check_sha(put.sha256)
    with transaction.atomic():
        blob_guard(put.sha256)
        # GC unlinks a blob only under the same guard after re-checking that no
        # row names it, so a blob seen here stays until this row commits.
        if not default_store().exists(put.sha256):
            raise BlobVanished(ERR_BLOB_VANISHED)
        artifact, created = Artifact.objects.get_or_create(
            sha256=put.sha256,
            defaults={
                "size": put.size,
                "media_type": media_type[:255] or "application/octet-stream",
                "artifact_class": artifact_class,
                "title": title[:300],
                "meta": meta,
                "integrity": Artifact.Integrity.OK,
                "verified_at": timezone.now(),
            },
        )
        source_ids = [
            int(s) for s in dict.fromkeys(source_ids) if int(s) != artifact.pk
        ]
        if source_ids:
            found = set(
                Artifact.objects.filter(pk__in=source_ids).values_list("pk", flat=True)
            )
            if len(found) != len(source_ids):
                raise ArtifactError(ERR_UNKNOWN_SOURCE)
            have = set(
                ArtifactSource.objects.filter(artifact=artifact).values_list(
                    "source_id", flat=True
                )
            )
            ArtifactSource.objects.bulk_create(
                [
                    ArtifactSource(artifact=artifact, source_id=sid, position=i)
                    for i, sid in enumerate(source_ids)
                    if sid not in have
                ]
            )
    artifact._created = created  # for callers that log dedup
    return artifact


def artifact_store(
    *,
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
    2. Write the blob (temp, fsync, rename, fsync dir).
    3. Create or find the row. A crash between 2 and 3 leaves an unreferenced
       blob, which the doctor sweeps after its grace period.
    """
    _check_class(artifact_class)
    put = blob_put(data=data, stream=stream, file=file, max_bytes=max_bytes)
    record = functools.partial(
        artifact_record,
        media_type=media_type,
        artifact_class=artifact_class,
        title=title,
        meta=meta,
        source_ids=source_ids,
    )
    try:
        return record(put=put)
    except BlobVanished:
        if data is None:
            raise  # a stream cannot be replayed; the caller sends it again
        return record(put=blob_put(data=data))


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
