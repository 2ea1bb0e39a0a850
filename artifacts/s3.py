"""Blobs as objects in an S3-compatible bucket (``PIPPA_BLOB_URL=s3://bucket/prefix``).

The same interface and promises as the folder store (``artifacts.store``),
through boto3, so workers on several hosts share only the database and the
bucket. Why boto3 rather than obstore: it sends the sha256 we computed
(``ChecksumSHA256``), so the server refuses bytes that do not hash to the key
they are stored under, instead of a checksum the client computes from
whatever it sends; it exposes the conditional puts (``If-None-Match: *``,
``If-Match: <etag>``) and the server's own error codes this store decides
by; and it is pure Python, the AWS SDK every S3-compatible server tests against.

Keys: ``<prefix>ab/abcd…``, the folder store's layout (content-addressed;
the fan-out keeps listings by prefix small on servers that keep keys in
folders, like SeaweedFS's filer).

A write (``put_stream``):

1. Stream the bytes into a spool file with no name on the local disk
   (``tempfile.TemporaryFile``: ``O_TMPFILE``, so a crash leaves nothing),
   hashing as they go; an in-memory payload (``put_bytes``) is hashed where
   it is. The key is the sha, so it is known only once the bytes are read.
2. ``admit(sha, size)`` (a quota): refused, nothing was sent.
3. PUT with ``If-None-Match: *`` and ``x-amz-checksum-sha256``: the server
   stores the object only if the key is new and the bytes hash to the key.
   The put returns once the server acknowledged the object: the caller's
   row commits after that ("write before show").
4. A 412 says the key exists: the first writer won. It is checked, never
   trusted: read back and hashed. Intact, the put is a dedup
   (``created=False``). Damaged (bit rot, a hand), it is replaced by our
   bytes with ``If-Match: <the etag we checked>``, so a writer that healed it
   meanwhile is not overwritten blindly; a 412 there checks again. An
   intact object older than half the doctor's grace period is replaced the
   same way, which renews its ``LastModified``: the doctor's sweep of objects
   no row names never takes one a row is about to name (the folder store
   renews a file's mtime for the same reason).

Reads stream (``open`` gives the response body); ``heads``, ``states`` and
``unlink`` of many shas run a few requests at a time. Deletion is
``unlink``, called only by ``artifacts.gc`` under the per-sha guard, after
the pending-unlink record committed.

Durability is the server's: S3 acknowledges a put once the object is stored
durably. SeaweedFS (the server the tests run) writes to its volume files
without fsync by default; ``docs/hosts.md`` says how to make it sync.
"""

from __future__ import annotations

import base64
import errno
import functools
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from io import BytesIO
from typing import BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from artifacts.store import (
    SHA256_RE,
    Admit,
    BlobError,
    BlobMissing,
    BlobStore,
    PutResult,
    StoredBlob,
    check_sha,
    read_digest,
    write_hashed,
)

# Requests of a batch (heads, states, unlinks) in flight at once.
PARALLEL = 8
# Times a put re-checks an object that others keep replacing meanwhile.
MAX_CHECKS = 4
ERR_BAD_URL = "PIPPA_BLOB_URL must be s3://bucket or s3://bucket/prefix"
ERR_CONTENDED = "the object under sha {sha} kept changing while it was being stored"

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


class BlobConflict(BlobError):
    """Others kept replacing the object while this write checked it."""


class StoreUnavailable(BlobError, OSError):
    """The bucket did not answer as asked (the server down or refusing, the
    network cut): an ``OSError``, so every caller that meets a failing disk
    (the executor's "output unsaved", the GC's logged unlink, the worker's
    back-off) meets a failing bucket the same way."""


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise StoreUnavailable(errno.EIO, f"the bucket refused: {exc}") from exc


def _bucket_call(method):
    """Turn what boto3 raises into ``StoreUnavailable`` at the store's surface."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        with _translated():
            return method(*args, **kwargs)

    return call


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _missing(exc: ClientError) -> bool:
    return _code(exc) in _MISSING_CODES or _status(exc) == 404


def _precondition_failed(exc: ClientError) -> bool:
    return _code(exc) == "PreconditionFailed" or _status(exc) == 412


def _checksum(sha: str) -> str:
    """The sha256 as S3 carries it: the digest's bytes in base64."""
    return base64.b64encode(bytes.fromhex(sha)).decode("ascii")


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def s3_client():
    """One boto3 client per process and environment (thread-safe, pooled).

    The endpoint and credentials are boto3's own variables
    (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, …).
    Checksums are sent when asked for only: the store sends its sha256 and
    checks what it reads by hashing it.
    """
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
        "AWS_ENDPOINT_URL"
    )
    region = (
        os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1"
    )
    # S3-compatible servers on a host name of their own take the bucket in
    # the path; AWS itself is reached as boto3 decides.
    style = os.environ.get("PIPPA_S3_ADDRESSING_STYLE") or (
        "path" if endpoint else "auto"
    )
    key = (
        endpoint,
        region,
        style,
        os.environ.get("AWS_ACCESS_KEY_ID"),
        os.environ.get("AWS_SECRET_ACCESS_KEY"),
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint,
                region_name=region,
                config=Config(
                    s3={"addressing_style": style},
                    retries={"mode": "standard", "max_attempts": 4},
                    connect_timeout=5,
                    read_timeout=60,
                    max_pool_connections=PARALLEL * 2,
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                ),
            )
            _clients[key] = client
    return client


@dataclass(frozen=True)
class _Found:
    etag: str
    intact: bool
    modified: float


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix ending in "/" or empty) of ``s3://bucket/prefix``."""
    if not url.startswith("s3://"):
        raise ValueError(ERR_BAD_URL)
    bucket, _, prefix = url[len("s3://") :].partition("/")
    prefix = prefix.strip("/")
    if not bucket:
        raise ValueError(ERR_BAD_URL)
    return bucket, f"{prefix}/" if prefix else ""


class S3Store(BlobStore):
    """Blobs as objects under a prefix of one bucket."""

    kind = "s3"
    remote = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client=None,
        refresh_after: float = 1800.0,
        spool_dir: str | None = None,
    ):
        self.bucket = bucket
        self.prefix = prefix
        self.client = client or s3_client()
        self.refresh_after = refresh_after
        self.spool_dir = spool_dir

    @classmethod
    def from_url(cls, url: str, **kwargs) -> S3Store:
        bucket, prefix = parse_url(url)
        return cls(bucket, prefix, **kwargs)

    def key(self, sha: str) -> str:
        sha = check_sha(sha)
        return f"{self.prefix}{sha[:2]}/{sha}"

    def describe(self) -> str:
        endpoint = self.client.meta.endpoint_url
        return f"the bucket s3://{self.bucket}/{self.prefix} at {endpoint}"

    @_bucket_call
    def bucket_create(self) -> bool:
        """Create the bucket if it is not there; return whether it was made."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except ClientError as exc:
            if not _missing(exc):
                raise
        self.client.create_bucket(Bucket=self.bucket)
        return True

    @_bucket_call
    def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the bucket answers (a worker's
        probe after a fault)."""
        self.client.head_bucket(Bucket=self.bucket)

    # -- writing ------------------------------------------------------------

    def put_bytes(self, data: bytes, *, admit: Admit | None = None) -> PutResult:
        # In memory already: hashed where it is, sent as it is.
        return self._timed(self._put_memory, bytes(data), admit)

    @_bucket_call
    def _put_memory(self, data: bytes, admit: Admit | None) -> PutResult:
        sha = hashlib.sha256(data).hexdigest()
        if admit is not None:
            admit(sha, len(data))
        return self._put_named(sha, len(data), BytesIO(data))

    @_bucket_call
    def _put_stream(
        self,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None,
        expected_size: int | None,
        admit: Admit | None,
    ) -> PutResult:
        with tempfile.TemporaryFile(dir=self.spool_dir) as spool:
            sha, size = write_hashed(spool, chunks, max_bytes, expected_size)
            if admit is not None:
                admit(sha, size)
            return self._put_named(sha, size, spool)

    def _send(self, sha: str, size: int, body: BinaryIO, **condition) -> None:
        body.seek(0)
        self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(sha),
            Body=body,
            ContentLength=size,
            ContentType="application/octet-stream",
            ChecksumSHA256=_checksum(sha),
            **condition,
        )

    def _put_named(self, sha: str, size: int, body: BinaryIO) -> PutResult:
        """Steps 3 and 4 of the module docstring."""
        try:
            self._send(sha, size, body, IfNoneMatch="*")
            return PutResult(sha, size, created=True)
        except ClientError as exc:
            if not _precondition_failed(exc):
                raise
        for _ in range(MAX_CHECKS):
            found = self._check(sha)
            try:
                if found is None:  # gone since the 412 (a GC): the first writer again
                    self._send(sha, size, body, IfNoneMatch="*")
                    return PutResult(sha, size, created=True)
                fresh = found.modified > datetime.now(UTC).timestamp() - (
                    self.refresh_after
                )
                if found.intact and fresh:
                    return PutResult(sha, size, created=False)
                self._send(sha, size, body, IfMatch=found.etag)
                return PutResult(sha, size, created=False)
            except ClientError as exc:
                if not _precondition_failed(exc):
                    raise
        raise BlobConflict(ERR_CONTENDED.format(sha=sha))

    def _check(self, sha: str) -> _Found | None:
        """Read the object back and hash it; None if it is not there."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key(sha))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        with response["Body"] as body:
            _, digest = read_digest(body)
        return _Found(
            etag=response["ETag"],
            intact=digest == sha,
            modified=response["LastModified"].timestamp(),
        )

    @_bucket_call
    def settle(self, sha: str) -> bool:
        """Read back and hashed: an object the server acknowledged is durable
        by the server's promise."""
        found = self._check(check_sha(sha))
        return found is not None and found.intact

    # -- reading ------------------------------------------------------------

    def _head(self, sha: str) -> dict | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(sha))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise

    @_bucket_call
    def exists(self, sha: str) -> bool:
        return self._head(sha) is not None

    @_bucket_call
    def open(self, sha: str) -> BinaryIO:
        """The response body, streamed from the server as it is read."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key(sha))
        except ClientError as exc:
            if _missing(exc):
                raise BlobMissing("no blob with that sha") from None
            raise
        return response["Body"]

    @_bucket_call
    def head(self, sha: str, size: int) -> bytes:
        if size <= 0:
            if not self.exists(sha):
                raise BlobMissing("no blob with that sha")
            return b""
        try:
            response = self.client.get_object(
                Bucket=self.bucket, Key=self.key(sha), Range=f"bytes=0-{size - 1}"
            )
        except ClientError as exc:
            if _missing(exc):
                raise BlobMissing("no blob with that sha") from None
            if _code(exc) == "InvalidRange":
                return b""  # an empty object has no byte 0
            raise
        with response["Body"] as body:
            return body.read(size)

    @_bucket_call
    def size(self, sha: str) -> int:
        head = self._head(sha)
        if head is None:
            raise BlobMissing("no blob with that sha")
        return int(head["ContentLength"])

    def _many(self, fn, shas) -> dict:
        """{sha: fn(sha)} for the well-formed shas, a few requests at a time;
        a None answer is left out."""
        wanted = [s for s in dict.fromkeys(shas) if isinstance(s, str)]
        wanted = [s for s in wanted if SHA256_RE.match(s)]
        if not wanted:
            return {}
        if len(wanted) == 1:
            answers = [fn(wanted[0])]
        else:
            with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
                answers = list(pool.map(fn, wanted))
        return {s: a for s, a in zip(wanted, answers, strict=True) if a is not None}

    @_bucket_call
    def heads(self, shas, size: int) -> dict[str, bytes]:
        def one(sha: str) -> bytes | None:
            try:
                return self.head(sha, size)
            except (BlobMissing, StoreUnavailable):
                return None  # missing or unreadable: left out, as in a folder

        return self._many(one, shas)

    @_bucket_call
    def states(self, shas, *, verify: bool) -> dict[str, tuple[int, bool]]:
        def state(sha: str) -> tuple[int, bool] | None:
            if not verify:
                head = self._head(sha)
                return None if head is None else (int(head["ContentLength"]), True)
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self.key(sha))
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise
            with response["Body"] as body:
                size, digest = read_digest(body)
            return size, digest == sha

        return self._many(state, shas)

    # -- listing ------------------------------------------------------------

    def iter_blobs(self) -> Iterator[StoredBlob]:
        """Every object under the prefix whose key is ``ab/<sha>``; anything
        else there is not this store's and is left out."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        )
        with _translated():
            yield from self._listed(pages)

    def _listed(self, pages) -> Iterator[StoredBlob]:
        for page in pages:
            for item in page.get("Contents", ()):
                fan, _, sha = item["Key"][len(self.prefix) :].partition("/")
                if SHA256_RE.match(sha) and sha.startswith(fan) and len(fan) == 2:
                    yield StoredBlob(
                        sha, int(item["Size"]), item["LastModified"].timestamp()
                    )

    # -- removing -----------------------------------------------------------

    @_bucket_call
    def unlink(self, sha: str) -> bool:
        if self._head(sha) is None:
            return False
        self.client.delete_object(Bucket=self.bucket, Key=self.key(sha))
        return True
