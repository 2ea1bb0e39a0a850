"""Damage a stored blob the way a disk, a bucket's operator or a hand can,
behind every row's back, in whichever store holds it."""

from __future__ import annotations

from artifacts.store import BlobStore, FolderStore, default_store


def blob_lose(sha: str, store: BlobStore | None = None) -> None:
    """Remove the blob of ``sha`` (its file, or its object)."""
    store = store or default_store()
    if isinstance(store, FolderStore):
        store.path(sha).unlink()
        return
    store.client.delete_object(Bucket=store.bucket, Key=store.key(sha))


def blob_overwrite(sha: str, data: bytes, store: BlobStore | None = None) -> None:
    """Replace the bytes stored under ``sha`` with ``data``: bit rot."""
    store = store or default_store()
    if isinstance(store, FolderStore):
        path = store.path(sha)
        path.chmod(0o600)
        path.write_bytes(data)
        return
    # No checksum sent: the server keeps whatever it is given.
    store.client.put_object(Bucket=store.bucket, Key=store.key(sha), Body=data)


def blob_plant(sha: str, data: bytes, store: BlobStore | None = None) -> None:
    """Put ``data`` under ``sha`` with no row naming it (what a crash leaves)."""
    store = store or default_store()
    if isinstance(store, FolderStore):
        store._ensure_layout()
        path = store.path(sha)
        path.write_bytes(data)
        path.chmod(0o400)  # as the store makes its files: only the stray is wrong
        return
    store.client.put_object(Bucket=store.bucket, Key=store.key(sha), Body=data)
