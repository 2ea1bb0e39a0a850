"""The content-addressed blob store: payload bytes named by their sha256.

``BlobStore`` is the interface every caller uses; ``default_store()`` gives
the configured one. Two stores implement it:

- ``FolderStore`` (the default): files under ``PIPPA_BLOB_DIR`` on the local
  disk. This module.
- ``artifacts.s3.S3Store``: objects in an S3-compatible bucket, chosen by
  ``PIPPA_BLOB_URL=s3://bucket/prefix`` (endpoint and credentials from the
  environment), so workers on several hosts share only the database and the
  bucket.

What both promise ("write before show"): ``put_*`` returns only once the
bytes are durably stored under their sha (a file and its folder fsynced; an
object the server acknowledged after checking the sha256 sent with it), so no
row can name a blob before it is there; nothing trusts a blob for being
there (a second write of the same sha checks or replaces what it finds);
a write that fails, or that ``admit`` refuses, leaves nothing named; reads
stream.

The folder store's layout: ``<BLOB_DIR>/ab/abcd…`` (256 fan-out folders:
created once each, so a write rarely pays for a new folder's fsync; a million
blobs is ~4k per folder) and ``<BLOB_DIR>/tmp/`` for writes in flight.

A write streams the bytes, hashing as it goes, into a file with no name yet
(``O_TMPFILE`` in ``tmp/``), links it under its sha, then fsyncs the file and
the folder; only after both does ``put_*`` return, so no row can name a file
before its bytes and its name are on disk. Linking
before the file's fsync lets that one fsync carry the data, the inode and the
new name together; the folder's fsync then finds little left to write (on
this machine's ext4 it saved a third of a step's disk time against the temp
file + fsync + rename + folder fsync it replaces, ``docs/serving-and-bench.md``).

The price: a power cut between the link and the fsyncs can leave a file under
its sha whose bytes never reached the disk. No row names it (its row commits
only after the fsyncs), so nothing shown is lost, and nothing trusts a file
just because it is there: a later write of the same sha replaces it with
bytes it has synced itself (``created=False``), ``settle`` checks and syncs
one before a row names it, and the doctor sweeps files no row names.

Where a file with no name cannot be made (not Linux, a filesystem without
``O_TMPFILE``, no ``/proc``), the store falls back to a named temp file in
``tmp/``: fsync, rename onto the sha, fsync the folder. A crash there leaves
at most a temp file, which the doctor sweeps.

Every payload is a blob, whatever its size: the database holds refs (shas),
never payload bytes. No store touches the database.

The folder store is private to the service's account: folders are made 0700
and blob files 0400, whatever the process's umask (``PRIVATE_DIR``,
``PRIVATE_FILE``); ``pippa_doctor`` reports looser modes and ``--repair``
tightens them.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.utils.module_loading import import_string

from pippa_site import metrics

SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
CHUNK = 1024 * 1024

ERR_BAD_SHA = "not a sha256: expected 64 lowercase hex characters"
ERR_MISSING = "no blob with that sha"
ERR_TOO_LARGE = "payload exceeds the size limit"
ERR_INCOMPLETE = "received {got} of the {expected} bytes declared; nothing was stored"

# The data folder, the blob folders and the blob files: the service's account only.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o400

# Called with (sha, size) once the bytes are hashed and before they are named:
# raising there (a quota, say) leaves nothing stored.
Admit = Callable[[str, int], None]


class BlobError(Exception):
    """Base class of blob store errors."""


class InvalidSha(BlobError, ValueError):
    pass


class BlobMissing(BlobError, FileNotFoundError):
    pass


class BlobTooLarge(BlobError, ValueError):
    pass


class BlobIncomplete(BlobError, ValueError):
    """The stream ended before the size it declared: nothing was stored."""


# What the caller sent, not the store failing: not counted as a put error.
CALLER_ERRORS = (BlobTooLarge, BlobIncomplete, InvalidSha)


@dataclass(frozen=True)
class PutResult:
    sha256: str
    size: int
    created: bool  # False when the bytes were already stored (dedup)


@dataclass(frozen=True)
class StoredBlob:
    """One blob as a listing sees it: for the doctor's sweep of unnamed blobs."""

    sha256: str
    size: int
    modified: float  # seconds since the epoch: a file's mtime, an object's LastModified


def check_sha(sha: object) -> str:
    """Return ``sha`` if it is 64 lowercase hex characters, else raise.

    Runs before any path or key is built, so ``../`` and friends never reach
    the filesystem or the bucket.
    """
    if not isinstance(sha, str) or not SHA256_RE.match(sha):
        raise InvalidSha(ERR_BAD_SHA)
    return sha


def _fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore(ABC):
    """What every blob store does; ``default_store()`` gives the configured one.

    Writes: ``put_stream`` (and ``put_bytes``, ``put_file`` over it) store
    bytes under their sha and return only once they are durable; ``admit``
    is asked before they are named. Reads stream (``open``, ``iter_chunks``);
    ``heads`` and ``states`` serve pages and the doctor many shas at a time.
    ``unlink`` is for ``artifacts.gc`` only, under the per-sha guard.
    """

    #: The store's kind, as metrics and the doctor name it.
    kind = ""
    #: Whether a look (``exists``) is a network round trip, not a stat.
    remote = False

    # -- writing ------------------------------------------------------------

    def put_stream(
        self,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None = None,
        expected_size: int | None = None,
        admit: Admit | None = None,
    ) -> PutResult:
        """Store the concatenation of ``chunks``; hold at most one chunk in memory.

        With ``expected_size`` (an upload's Content-Length), any other count
        is ``BlobIncomplete``: a body cut short is never stored; more than
        ``max_bytes`` is ``BlobTooLarge``. Whatever goes wrong before the
        blob is named (``admit`` refusing included), nothing is left.
        """
        return self._timed(
            self._put_stream,
            chunks,
            max_bytes=max_bytes,
            expected_size=expected_size,
            admit=admit,
        )

    def put_bytes(self, data: bytes, *, admit: Admit | None = None) -> PutResult:
        return self.put_stream(_chunks_of(data), admit=admit)

    def put_file(
        self,
        fh: BinaryIO,
        *,
        max_bytes: int | None = None,
        admit: Admit | None = None,
    ) -> PutResult:
        return self.put_stream(
            iter(lambda: fh.read(CHUNK), b""), max_bytes=max_bytes, admit=admit
        )

    def _timed(self, put: Callable[..., PutResult], *args, **kwargs) -> PutResult:
        """Run a put and record it (``pippa_site.metrics``) once it returned or failed:
        never before the bytes are durable."""
        started = time.perf_counter()
        try:
            result = put(*args, **kwargs)
        except CALLER_ERRORS:
            raise
        except Exception:
            metrics.blob_put_failed(self.kind)
            raise
        metrics.blob_put_done(
            self.kind, time.perf_counter() - started, result.size, result.created
        )
        return result

    @abstractmethod
    def _put_stream(
        self,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None,
        expected_size: int | None,
        admit: Admit | None,
    ) -> PutResult: ...

    @abstractmethod
    def settle(self, sha: str) -> bool:
        """Whether the blob is there with bytes that hash to ``sha``, made
        durable before saying so: for a caller about to name a blob it did
        not write itself."""

    # -- reading ------------------------------------------------------------

    @abstractmethod
    def exists(self, sha: str) -> bool: ...

    @abstractmethod
    def open(self, sha: str) -> BinaryIO:
        """A read-only stream of the blob's bytes; ``BlobMissing`` if none."""

    @abstractmethod
    def size(self, sha: str) -> int: ...

    @abstractmethod
    def heads(self, shas, size: int) -> dict[str, bytes]:
        """The first ``size`` bytes of each blob there is: a page's excerpts."""

    @abstractmethod
    def states(self, shas, *, verify: bool) -> dict[str, tuple[int, bool]]:
        """{sha: (size, intact)} for each of ``shas`` there is; a missing one
        is left out. ``intact`` is whether the bytes hash to their sha (always
        True when not ``verify``): the doctor's integrity scan."""

    def get(self, sha: str) -> bytes:
        with self.open(sha) as fh:
            return fh.read()

    def head(self, sha: str, size: int) -> bytes:
        """The first ``size`` bytes of one blob (an excerpt); ``BlobMissing``
        if there is none. A bucket reads only that range."""
        with self.open(sha) as fh:
            return fh.read(size)

    def iter_chunks(self, sha: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        with self.open(sha) as fh:
            yield from iter(lambda: fh.read(chunk_size), b"")

    def verify(self, sha: str) -> bool:
        """Return True if the blob exists and its bytes hash to ``sha``."""
        try:
            fh = self.open(sha)
        except BlobMissing:
            return False
        with fh:
            return read_digest(fh)[1] == sha

    # -- listing ------------------------------------------------------------

    @abstractmethod
    def iter_blobs(self) -> Iterator[StoredBlob]:
        """Every well-named blob there is (the doctor's listing)."""

    def shas(self) -> Iterator[str]:
        for blob in self.iter_blobs():
            yield blob.sha256

    def iter_temp_files(self) -> Iterator[Path]:
        """Local temp files a crashed write may have left (the doctor's sweep)."""
        return iter(())

    def loose_paths(self) -> list[tuple[Path, int]]:
        """(path, the mode it should have) for each local file or folder of
        the store that other accounts may read (``pippa_doctor``)."""
        return []

    @abstractmethod
    def describe(self) -> str:
        """Where the blobs are, in words (the doctor's report)."""

    # -- removing -----------------------------------------------------------

    @abstractmethod
    def unlink(self, sha: str) -> bool:
        """Remove a blob; return whether one was there.

        Callers hold the per-sha guard (``artifacts.gc.blobs_unlink``).
        """


class FolderStore(BlobStore):
    """Blobs as files under one root folder on the local disk (the default)."""

    kind = "folder"

    def __init__(self, root: Path | str, *, fsync: bool = True):
        self.root = Path(root)
        self.tmp_dir = self.root / "tmp"
        self.fsync = fsync
        # The hot path (a step's put and its exists check) builds its paths as
        # strings: pathlib's parsing cost more than the syscalls it wraps.
        self._root = os.fspath(self.root)
        self._tmp = os.fspath(self.tmp_dir)
        self._anonymous: bool | None = None  # O_TMPFILE works here (put_stream)

    # -- paths --------------------------------------------------------------

    def path(self, sha: str) -> Path:
        sha = check_sha(sha)
        return self.root / sha[:2] / sha

    def exists(self, sha: str) -> bool:
        sha = check_sha(sha)
        return os.path.isfile(os.path.join(self._root, sha[:2], sha))

    def describe(self) -> str:
        return f"the folder {self.root}"

    def iter_blobs(self) -> Iterator[StoredBlob]:
        for sha, path in self.iter_files():
            try:
                info = os.stat(path)
            except FileNotFoundError:
                continue
            yield StoredBlob(sha, info.st_size, info.st_mtime)

    def iter_files(self) -> Iterator[tuple[str, Path]]:
        """Yield (sha, path) for every well-named blob file on disk."""
        # os.scandir, not Path.iterdir: the doctor walks every blob twice.
        try:
            folders = sorted(
                entry.name
                for entry in os.scandir(self._root)
                if len(entry.name) == 2 and entry.is_dir()
            )
        except FileNotFoundError:
            return
        for name in folders:
            folder = self.root / name
            with os.scandir(os.path.join(self._root, name)) as entries:
                for entry in entries:
                    sha = entry.name
                    if sha.startswith(name) and SHA256_RE.match(sha):
                        yield sha, folder / sha

    def loose_paths(self) -> list[tuple[Path, int]]:
        """(path, the mode it should have) for each folder or file of the
        store whose mode lets group or others in (``pippa_doctor``)."""
        loose = []
        folders = [self.root, self.tmp_dir]
        try:
            folders += [
                self.root / entry.name
                for entry in os.scandir(self._root)
                if len(entry.name) == 2 and entry.is_dir()
            ]
        except FileNotFoundError:
            return []
        for folder in folders:
            try:
                if os.stat(folder).st_mode & 0o077:
                    loose.append((folder, PRIVATE_DIR))
            except FileNotFoundError:
                continue
        for _, path in self.iter_files():
            try:
                if os.stat(path).st_mode & 0o077:
                    loose.append((path, PRIVATE_FILE))
            except FileNotFoundError:
                pass
        return loose

    def iter_temp_files(self) -> Iterator[Path]:
        if self.tmp_dir.is_dir():
            yield from self.tmp_dir.iterdir()

    # -- writing ------------------------------------------------------------

    def _ensure_layout(self) -> None:
        """Create tmp/ and the 256 fan-out folders once, durably.

        Done up front so an ordinary write never creates a folder and never
        pays for fsyncing one. Checked on every write (one stat): the store
        object lives as long as the process, the folder may not.
        """
        if os.path.isdir(os.path.join(self._root, "ff")):
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(PRIVATE_DIR)  # mkdir's mode is cut by the umask; chmod is not
        self.tmp_dir.mkdir(exist_ok=True)
        self.tmp_dir.chmod(PRIVATE_DIR)
        for i in range(256):
            folder = self.root / f"{i:02x}"
            folder.mkdir(exist_ok=True)
            folder.chmod(PRIVATE_DIR)
        if self.fsync:
            _fsync_dir(self.root)
            _fsync_dir(self.root.parent)

    def _put_stream(
        self,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None,
        expected_size: int | None,
        admit: Admit | None,
    ) -> PutResult:
        """Stream into a file in ``tmp/`` (same filesystem), hashed as it
        goes; then name it by its sha and fsync it and its folder (the
        module's docstring has the order and why). If a blob of that sha is
        there already it is replaced by these bytes: the same by
        construction, and a copy that was damaged or lost on disk is healed;
        a reused blob also gets a fresh mtime, so the doctor's grace period
        covers it until its row commits.
        """
        self._ensure_layout()
        if self._anonymous is None:
            self._anonymous = self._anonymous_files_work()
        if not self._anonymous:
            return self._put_via_rename(chunks, max_bytes, expected_size, admit)
        fd = os.open(self._tmp, os.O_TMPFILE | os.O_WRONLY, PRIVATE_FILE)
        with os.fdopen(fd, "wb") as out:
            sha, size = write_hashed(out, chunks, max_bytes, expected_size)
            if admit is not None:
                admit(sha, size)  # refused: the file with no name goes with fd
            folder = os.open(
                os.path.join(self._root, sha[:2]), os.O_RDONLY | os.O_DIRECTORY
            )
            try:
                created = _link(fd, folder, sha)
                if self.fsync:
                    os.fsync(fd)
                if not created:
                    # Never trust what is there: it may be a copy whose bytes
                    # a power cut kept from the disk. Ours are synced; they
                    # take the name.
                    temp = self._temp_name()
                    os.link(_fd_path(fd), temp, src_dir_fd=folder, follow_symlinks=True)
                    try:
                        os.replace(temp, os.path.join(self._root, sha[:2], sha))
                    except BaseException:
                        Path(temp).unlink(missing_ok=True)
                        raise
                if self.fsync:
                    os.fsync(folder)
            finally:
                os.close(folder)
        return PutResult(sha, size, created=created)

    def _put_via_rename(
        self,
        chunks: Iterable[bytes],
        max_bytes: int | None,
        expected_size: int | None,
        admit: Admit | None,
    ) -> PutResult:
        """The fallback write: named temp file, fsync, rename, fsync the folder."""
        fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix="put-")
        try:
            with os.fdopen(fd, "wb") as out:
                sha, size = write_hashed(out, chunks, max_bytes, expected_size)
                if admit is not None:
                    admit(sha, size)
                if self.fsync:
                    os.fsync(fd)
            folder = os.path.join(self._root, sha[:2])
            final = os.path.join(folder, sha)
            existed = os.path.isfile(final)
            os.chmod(tmp, PRIVATE_FILE)
            os.replace(tmp, final)
            if self.fsync:
                _fsync_dir(folder)
            return PutResult(sha, size, created=not existed)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _temp_name(self) -> str:
        return os.path.join(self._tmp, f"put-{os.urandom(8).hex()}")

    def _anonymous_files_work(self) -> bool:
        """Whether this folder's filesystem makes files with no name that
        ``/proc`` can link (Linux with ``O_TMPFILE``): checked once a store."""
        if not hasattr(os, "O_TMPFILE"):
            return False
        name = os.path.basename(self._temp_name())
        folder = os.open(self._tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fd = os.open(self._tmp, os.O_TMPFILE | os.O_WRONLY, PRIVATE_FILE)
            try:
                _link(fd, folder, name)
            finally:
                os.close(fd)
            os.unlink(name, dir_fd=folder)
        except OSError:
            return False
        finally:
            os.close(folder)
        return True

    def settle(self, sha: str) -> bool:
        """File and folder fsynced before saying yes: a file under a sha may
        be one whose bytes a power cut kept from the disk (module docstring)."""
        sha = check_sha(sha)
        try:
            fd = os.open(os.path.join(self._root, sha[:2], sha), os.O_RDONLY)
        except FileNotFoundError:
            return False
        with os.fdopen(fd, "rb") as fh:
            if read_digest(fh)[1] != sha:
                return False
            if self.fsync:
                os.fsync(fd)
        if self.fsync:
            _fsync_dir(os.path.join(self._root, sha[:2]))
        return True

    # -- reading ------------------------------------------------------------

    def open(self, sha: str) -> BinaryIO:
        try:
            return self.path(sha).open("rb")
        except FileNotFoundError:
            raise BlobMissing(ERR_MISSING) from None

    def heads(self, shas, size: int) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for sha in dict.fromkeys(shas):
            try:
                with self.path(sha).open("rb") as fh:
                    found[sha] = fh.read(size)
            except (OSError, InvalidSha):  # missing or unreadable: left out
                pass
        return found

    def size(self, sha: str) -> int:
        try:
            return self.path(sha).stat().st_size
        except FileNotFoundError:
            raise BlobMissing(ERR_MISSING) from None

    def states(self, shas, *, verify: bool) -> dict[str, tuple[int, bool]]:
        """By string paths: the doctor scans every blob."""
        found: dict[str, tuple[int, bool]] = {}
        for sha in dict.fromkeys(shas):
            if not isinstance(sha, str) or not SHA256_RE.match(sha):
                continue  # no blob has a malformed name: missing
            path = os.path.join(self._root, sha[:2], sha)
            try:
                if not verify:
                    found[sha] = (os.stat(path).st_size, True)
                    continue
                with open(path, "rb") as fh:
                    size, digest = read_digest(fh)
                found[sha] = (size, digest == sha)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass  # missing: left out
        return found

    # -- removing -----------------------------------------------------------

    def unlink(self, sha: str) -> bool:
        try:
            self.path(sha).unlink()
        except FileNotFoundError:
            return False
        return True


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _link(fd: int, folder: int, name: str) -> bool:
    """Name the file open on ``fd`` (made with ``O_TMPFILE``) ``name`` in the
    folder open on ``folder``; False if the name is taken. ``os.link`` calls
    ``linkat`` with ``AT_SYMLINK_FOLLOW``, which links a file with no name
    through ``/proc``, only when it is given a folder's fd."""
    try:
        os.link(
            _fd_path(fd),
            name,
            src_dir_fd=folder,
            dst_dir_fd=folder,
            follow_symlinks=True,
        )
    except FileExistsError:
        return False
    return True


def write_hashed(
    out: BinaryIO,
    chunks: Iterable[bytes],
    max_bytes: int | None,
    expected_size: int | None,
) -> tuple[str, int]:
    """Write ``chunks`` to ``out``, hashing them; (sha256 hex, size). Refuses
    more than ``max_bytes``, and any count but ``expected_size`` when given."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        if not chunk:
            continue
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            raise BlobTooLarge(ERR_TOO_LARGE)
        if expected_size is not None and size > expected_size:
            raise BlobIncomplete(
                ERR_INCOMPLETE.format(got=size, expected=expected_size)
            )
        digest.update(chunk)
        out.write(chunk)
    if expected_size is not None and size != expected_size:
        raise BlobIncomplete(ERR_INCOMPLETE.format(got=size, expected=expected_size))
    out.flush()
    return digest.hexdigest(), size


def _chunks_of(data: bytes) -> Iterator[memoryview]:
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        yield view[start : start + CHUNK]


def read_digest(fh: BinaryIO) -> tuple[int, str]:
    """(size, sha256 hex) of what is left to read in ``fh``, a chunk at a time."""
    digest, size = hashlib.sha256(), 0
    for chunk in iter(lambda: fh.read(CHUNK), b""):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


# The stores a PIPPA_BLOB_URL may name, by its scheme.
URL_STORES = {"s3": "artifacts.s3.S3Store"}

_default: tuple[tuple, BlobStore] | None = None


def default_store() -> BlobStore:
    """The configured store, one object per setting (the step asks twice):
    the bucket ``PIPPA_BLOB_URL`` names, else the folder ``BLOB_DIR``."""
    global _default
    url = getattr(settings, "PIPPA_BLOB_URL", "")
    key = (
        url,
        settings.BLOB_DIR,
        getattr(settings, "PIPPA_FSYNC", True),
        settings.PIPPA_DOCTOR_GRACE_SECONDS,
    )
    if _default is None or _default[0] != key:
        if url:
            # By dotted path, like Django's backends: boto3 is imported only
            # where a bucket is used.
            scheme = url.partition("://")[0]
            kind = import_string(URL_STORES[scheme])
            store: BlobStore = kind.from_url(url, refresh_after=key[3] / 2)
        else:
            store = FolderStore(key[1], fsync=key[2])
        _default = (key, store)
    return _default[1]
