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


@pytest.fixture(params=["unnamed file", "named temp file"])
def either_store(request, tmp_path) -> BlobStore:
    """The store as it writes here (``O_TMPFILE``) and as it writes where
    that is missing (a named temp file, fsync, rename)."""
    store = BlobStore(tmp_path / "blobs")
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
    store, monkeypatch
):
    store.put_bytes(b"warm-up")  # the layout and the one-time O_TMPFILE probe
    seen = _spy_on_disk(monkeypatch)
    result = store.put_bytes(b"durable")
    final = store.path(result.sha256)
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
    assert list(store.iter_temp_files()) == []


def test_without_unnamed_files_a_write_syncs_the_temp_file_renames_it_then_syncs_the_folder(
    store, monkeypatch
):
    store._anonymous = False
    store.put_bytes(b"warm-up")  # the layout
    seen = _spy_on_disk(monkeypatch)
    result = store.put_bytes(b"durable")
    final = store.path(result.sha256)
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


def test_settle_says_yes_only_for_intact_bytes_and_syncs_them_first(store, monkeypatch):
    kept = store.put_bytes(b"kept")
    torn_sha = hashlib.sha256(b"torn").hexdigest()
    (store.root / torn_sha[:2] / torn_sha).write_bytes(b"to")
    seen = _spy_on_disk(monkeypatch)
    assert store.settle(kept.sha256)
    assert seen == [
        ("fsync", str(store.path(kept.sha256))),
        ("fsync", str(store.path(kept.sha256).parent)),
    ]
    assert not store.settle(torn_sha)
    assert not store.settle("0" * 64)
    with pytest.raises(InvalidSha):
        store.settle("../etc/passwd")


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


def test_where_unnamed_files_cannot_be_made_the_store_falls_back_to_a_named_temp_file(
    store, monkeypatch
):
    real_open = os.open

    def no_tmpfile(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(95, "Operation not supported")  # EOPNOTSUPP
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    result = store.put_bytes(b"still stored")
    assert store._anonymous is False
    assert store.get(result.sha256) == b"still stored"
    assert store.path(result.sha256).stat().st_mode & 0o777 == 0o400
    assert list(store.iter_temp_files()) == []
