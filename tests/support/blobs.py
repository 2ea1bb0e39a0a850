"""Damage a stored blob file the way a disk or a hand can."""

from __future__ import annotations

from artifacts.store import BlobStore, default_store


def blob_lose(sha: str, store: BlobStore | None = None) -> None:
    """Remove the file of ``sha`` behind every row's back."""
    store = store or default_store()
    store.path(sha).unlink()


def blob_overwrite(sha: str, data: bytes, store: BlobStore | None = None) -> None:
    """Replace the bytes of ``sha``'s file with ``data``: bit rot."""
    store = store or default_store()
    path = store.path(sha)
    path.chmod(0o600)
    path.write_bytes(data)
