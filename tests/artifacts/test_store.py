"""The blob store: atomic, durable, deduplicated, streaming, traversal-proof."""

from __future__ import annotations

import hashlib
import os
import tracemalloc

import pytest

from artifacts.store import BlobMissing, BlobStore, BlobTooLarge, InvalidSha, check_sha


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def test_put_then_get_returns_the_same_bytes_under_their_sha(store):
    result = store.put_bytes(b"hello")
    assert result.sha256 == hashlib.sha256(b"hello").hexdigest()
    assert result.size == 5
    assert result.created
    assert store.get(result.sha256) == b"hello"
    assert store.path(result.sha256).name == result.sha256
    assert store.verify(result.sha256)


def test_same_bytes_twice_are_stored_once(store):
    first = store.put_bytes(b"same")
    second = store.put_bytes(b"same")
    assert first.sha256 == second.sha256
    assert not second.created
    assert len(list(store.iter_files())) == 1
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
    assert list(store.iter_files()) == []
    assert list(store.iter_temp_files()) == []


def test_a_stream_over_the_size_cap_is_refused_and_leaves_nothing(store):
    with pytest.raises(BlobTooLarge):
        store.put_stream([b"x" * 10, b"y" * 10], max_bytes=15)
    assert list(store.iter_files()) == []
    assert list(store.iter_temp_files()) == []


def test_a_write_fsyncs_the_file_and_the_folder_before_it_returns(store, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    result = store.put_bytes(b"durable")
    final = store.path(result.sha256)
    assert any("/tmp/put-" in p for p in synced), synced  # the temp file's data
    assert str(final.parent) in synced  # the rename is made durable
    assert final.exists()


def test_the_rename_is_atomic_a_crash_before_it_leaves_only_a_temp_file(
    store, monkeypatch
):
    def crash(src, dst):
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        store.put_bytes(b"never shown")
    assert list(store.iter_files()) == []


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
    store, bad
):
    with pytest.raises(InvalidSha):
        check_sha(bad)
    with pytest.raises(InvalidSha):
        store.path(bad)
    with pytest.raises(InvalidSha):
        store.open(bad)


def test_verify_detects_a_corrupted_blob(store):
    result = store.put_bytes(b"original")
    path = store.path(result.sha256)
    os.chmod(path, 0o644)
    path.write_bytes(b"tampered")
    assert not store.verify(result.sha256)


def test_a_missing_blob_raises_a_clear_error_without_touching_the_database(store):
    """No database access is allowed here (no django_db mark): a filesystem class."""
    with pytest.raises(BlobMissing):
        store.get("0" * 64)
    assert not store.verify("0" * 64)


def test_streamed_reads_return_the_bytes_in_chunks(store):
    data = os.urandom(3 * 1024 * 1024 + 7)
    result = store.put_bytes(data)
    assert b"".join(store.iter_chunks(result.sha256, chunk_size=1 << 20)) == data


def test_storing_the_same_bytes_again_heals_a_damaged_copy(store):
    result = store.put_bytes(b"precious")
    path = store.path(result.sha256)
    path.chmod(0o644)
    path.write_bytes(b"rotten!!")  # same size, wrong bytes
    again = store.put_bytes(b"precious")
    assert not again.created
    assert store.verify(result.sha256)
    assert store.get(result.sha256) == b"precious"
