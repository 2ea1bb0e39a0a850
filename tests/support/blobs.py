"""Damage a stored blob the way a disk or a hand can, wherever its bytes live.

A small step output is an inline row in the database, anything else a file
(``artifacts.store``); tests that lose or corrupt "the blob" use these so they
damage the real bytes in either place.
"""

from __future__ import annotations

from artifacts.models import InlineBlob
from artifacts.store import BlobStore, default_store


def blob_lose(sha: str, store: BlobStore | None = None) -> None:
    """Remove the bytes of ``sha`` (file or inline row) behind every row's back."""
    store = store or default_store()
    path = store.path(sha)
    if path.exists():
        path.unlink()
        return
    assert InlineBlob.objects.filter(sha256=sha).delete()[0] == 1, f"no blob {sha}"


def blob_overwrite(sha: str, data: bytes, store: BlobStore | None = None) -> None:
    """Replace the bytes of ``sha`` (file or inline row) with ``data``: bit rot."""
    store = store or default_store()
    path = store.path(sha)
    if path.exists():
        path.chmod(0o644)
        path.write_bytes(data)
        return
    assert InlineBlob.objects.filter(sha256=sha).update(data=data) == 1, (
        f"no blob {sha}"
    )
