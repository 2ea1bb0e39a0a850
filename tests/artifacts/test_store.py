"""The blob stores: atomic, durable, deduplicated, streaming, traversal-proof.

The tests of what every store promises take ``store`` and run on the folder
and on a SeaweedFS bucket (``any_store``); those of how the folder writes
(its fsync order, its fallback) take ``folder``; those of how the bucket
writes (the checksum, the conditional puts) are in ``test_s3.py``."""

from __future__ import annotations

import hashlib
import os
import tracemalloc

import pytest

from artifacts.store import (
    BlobMissing,
    BlobStore,
    BlobTooLarge,
    FolderStore,
    InvalidSha,
    check_sha,
)
from tests.support.blobs import blob_overwrite, blob_plant


@pytest.fixture
def store(any_store) -> BlobStore:
    return any_store


@pytest.fixture
def folder(tmp_path) -> FolderStore:
    return FolderStore(tmp_path / "blobs")


def test_put_then_get_returns_the_same_bytes_under_their_sha(store):
    result = store.put_bytes(b"hello")
    assert result.sha256 == hashlib.sha256(b"hello").hexdigest()
    assert result.size == 5
    assert result.created
    assert store.get(result.sha256) == b"hello"
    assert list(store.shas()) == [result.sha256]
    assert store.verify(result.sha256)
    assert store.size(result.sha256) == 5


def test_same_bytes_twice_are_stored_once(store):
    first = store.put_bytes(b"same")
    second = store.put_bytes(b"same")
    assert first.sha256 == second.sha256
    assert not second.created
    assert len(list(store.shas())) == 1
    assert list(store.iter_temp_files()) == []


def test_empty_payload_is_a_valid_blob(store):
    result = store.put_bytes(b"")
    assert result.size == 0
    assert store.get(result.sha256) == b""


def test_a_large_stream_is_never_held_whole_in_memory(store):
    chunk = os.urandom(1024 * 1024)
    expected = hashlib.sha256()
    for _ in range(48):
        expected.update(chunk)

    def chunks():
        for _ in range(48):
            yield chunk

    tracemalloc.start()
    try:
        result = store.put_stream(chunks())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.sha256 == expected.hexdigest()
    assert result.size == 48 * 1024 * 1024
    assert peak < 8 * 1024 * 1024  # a few chunks at most, not 48 MiB


def test_a_stream_that_fails_midway_leaves_no_blob_and_no_temp_file(store):
    def chunks():
        yield b"first part"
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        store.put_stream(chunks())
    assert list(store.shas()) == []
    assert list(store.iter_temp_files()) == []


def test_a_stream_over_the_size_cap_is_refused_and_leaves_nothing(store):
    with pytest.raises(BlobTooLarge):
        store.put_stream([b"x" * 10, b"y" * 10], max_bytes=15)
    assert list(store.shas()) == []
    assert list(store.iter_temp_files()) == []


@pytest.fixture(params=["unnamed file", "named temp file"])
def either_store(request, tmp_path) -> FolderStore:
    """The store as it writes here (``O_TMPFILE``) and as it writes where
    that is missing (a named temp file, fsync, rename)."""
    store = FolderStore(tmp_path / "blobs")
    store._anonymous = request.param == "unnamed file"
    return store


def _spy_on_disk(monkeypatch) -> list[tuple[str, str]]:
    """Record (call, what) for each link, rename and fsync, in order."""
    seen: list[tuple[str, str]] = []
    real_fsync, real_link, real_replace = os.fsync, os.link, os.replace

    def fsync(fd):
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def link(src, dst, **kwargs):
        seen.append(("link", os.path.basename(dst)))
        return real_link(src, dst, **kwargs)

    def replace(src, dst, **kwargs):
        seen.append(("rename", os.path.basename(dst)))
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def test_a_write_is_named_and_durable_file_and_folder_before_it_returns(
    folder, monkeypatch
):
    folder.put_bytes(b"warm-up")  # the layout and the one-time O_TMPFILE probe
    seen = _spy_on_disk(monkeypatch)
    result = folder.put_bytes(b"durable")
    final = folder.path(result.sha256)
    # Named first, so the file's one fsync carries its bytes, inode and name;
    # then its folder.
    assert seen == [
        ("link", result.sha256),
        ("fsync", seen[1][1]),
        ("fsync", str(final.parent)),
    ], seen
    assert "/tmp/" in seen[1][1]  # the file itself, opened in tmp/ with no name
    assert final.read_bytes() == b"durable"
    assert final.stat().st_mode & 0o777 == 0o400
    assert list(folder.iter_temp_files()) == []


def test_without_unnamed_files_a_write_syncs_the_temp_file_renames_it_then_syncs_the_folder(
    folder, monkeypatch
):
    folder._anonymous = False
    folder.put_bytes(b"warm-up")  # the layout
    seen = _spy_on_disk(monkeypatch)
    result = folder.put_bytes(b"durable")
    final = folder.path(result.sha256)
    assert [call for call, _ in seen] == ["fsync", "rename", "fsync"], seen
    assert "/tmp/put-" in seen[0][1]
    assert seen[1] == ("rename", result.sha256)
    assert seen[2] == ("fsync", str(final.parent))
    assert final.read_bytes() == b"durable"
    assert final.stat().st_mode & 0o777 == 0o400


def test_a_crash_before_the_name_leaves_nothing_behind(either_store, monkeypatch):
    def power_cut(*args, **kwargs):
        raise KeyboardInterrupt("power cut")

    either_store.put_bytes(b"warm-up")
    monkeypatch.setattr(os, "link", power_cut)
    monkeypatch.setattr(os, "replace", power_cut)
    with pytest.raises(KeyboardInterrupt):
        either_store.put_bytes(b"never shown")
    assert [sha for sha, _ in either_store.iter_files()] == [
        hashlib.sha256(b"warm-up").hexdigest()
    ]
    if either_store._anonymous:  # the fallback leaves its temp file to the doctor
        assert list(either_store.iter_temp_files()) == []


def test_a_file_already_under_the_sha_is_replaced_by_bytes_synced_first(
    either_store, monkeypatch
):
    """What a power cut between a name and its fsync can leave: the sha's
    name on bytes that never reached the disk. The next write of those bytes
    does not trust it."""
    sha = hashlib.sha256(b"precious").hexdigest()
    torn = either_store.root / sha[:2] / sha
    either_store.put_bytes(b"warm-up")
    torn.write_bytes(b"")  # the name made it to disk, the bytes did not
    seen = _spy_on_disk(monkeypatch)
    again = either_store.put_bytes(b"precious")
    assert again.sha256 == sha
    assert not again.created
    assert torn.read_bytes() == b"precious"
    assert either_store.verify(sha)
    calls = [call for call, _ in seen]
    assert calls.index("fsync") < calls.index("rename") < len(calls) - 1
    assert seen[-1] == ("fsync", str(torn.parent))
    assert list(either_store.iter_temp_files()) == []


def test_settle_says_yes_only_for_intact_bytes_and_syncs_them_first(
    folder, monkeypatch
):
    kept = folder.put_bytes(b"kept")
    torn_sha = hashlib.sha256(b"torn").hexdigest()
    (folder.root / torn_sha[:2] / torn_sha).write_bytes(b"to")
    seen = _spy_on_disk(monkeypatch)
    assert folder.settle(kept.sha256)
    assert seen == [
        ("fsync", str(folder.path(kept.sha256))),
        ("fsync", str(folder.path(kept.sha256).parent)),
    ]
    assert not folder.settle(torn_sha)
    assert not folder.settle("0" * 64)
    with pytest.raises(InvalidSha):
        folder.settle("../etc/passwd")


@pytest.mark.parametrize(
    "bad",
    [
        "../../etc/passwd",
        "A" * 64,
        "a" * 63,
        "a" * 65,
        "g" * 64,
        "/" + "a" * 63,
        "a" * 62 + "/.",
        "",
        None,
        123,
        "a" * 64 + "\n",
    ],
)
def test_a_sha_that_is_not_64_lowercase_hex_is_refused_before_any_path_is_built(
    store, folder, bad
):
    with pytest.raises(InvalidSha):
        check_sha(bad)
    with pytest.raises(InvalidSha):
        folder.path(bad)
    for read in (store.open, store.exists, store.settle, store.unlink):
        with pytest.raises(InvalidSha):
            read(bad)


def test_verify_detects_a_corrupted_blob(store):
    result = store.put_bytes(b"original")
    blob_overwrite(result.sha256, b"tampered", store)
    assert not store.verify(result.sha256)
    assert store.states([result.sha256], verify=True) == {result.sha256: (8, False)}


def test_a_missing_blob_raises_a_clear_error_without_touching_the_database(store):
    """No database access is allowed here (no django_db mark): no store
    touches the database."""
    with pytest.raises(BlobMissing):
        store.get("0" * 64)
    assert not store.verify("0" * 64)


def test_streamed_reads_return_the_bytes_in_chunks(store):
    data = os.urandom(3 * 1024 * 1024 + 7)
    result = store.put_bytes(data)
    assert b"".join(store.iter_chunks(result.sha256, chunk_size=1 << 20)) == data


def test_storing_the_same_bytes_again_heals_a_damaged_copy(store):
    result = store.put_bytes(b"precious")
    blob_overwrite(result.sha256, b"rotten!!", store)  # same size, wrong bytes
    again = store.put_bytes(b"precious")
    assert not again.created
    assert store.verify(result.sha256)
    assert store.get(result.sha256) == b"precious"


def test_settle_says_yes_only_for_bytes_that_hash_to_their_sha(store):
    kept = store.put_bytes(b"kept")
    torn = hashlib.sha256(b"torn").hexdigest()
    blob_plant(torn, b"to", store)
    assert store.settle(kept.sha256)
    assert not store.settle(torn)
    assert not store.settle("0" * 64)


def test_heads_and_states_answer_for_many_shas_and_leave_out_missing_ones(store):
    shas = [store.put_bytes(f"blob number {i}".encode()).sha256 for i in range(12)]
    empty = store.put_bytes(b"").sha256
    missing = "0" * 64
    heads = store.heads([*shas, empty, missing, "not a sha"], 4)
    assert heads == {**dict.fromkeys(shas, b"blob"), empty: b""}
    states = store.states([*shas, missing], verify=False)
    assert set(states) == set(shas)
    assert states[shas[0]] == (13, True)


def test_an_unlinked_blob_is_gone_and_unlinking_it_again_says_so(store):
    sha = store.put_bytes(b"short-lived").sha256
    assert store.unlink(sha)
    assert not store.exists(sha)
    assert not store.unlink(sha)
    with pytest.raises(BlobMissing):
        store.open(sha)


def test_where_unnamed_files_cannot_be_made_the_store_falls_back_to_a_named_temp_file(
    folder, monkeypatch
):
    real_open = os.open

    def no_tmpfile(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(95, "Operation not supported")  # EOPNOTSUPP
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    result = folder.put_bytes(b"still stored")
    assert folder._anonymous is False
    assert folder.get(result.sha256) == b"still stored"
    assert folder.path(result.sha256).stat().st_mode & 0o777 == 0o400
    assert list(folder.iter_temp_files()) == []
