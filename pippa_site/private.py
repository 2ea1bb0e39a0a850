"""The data folder is the service's account's alone, whatever the umask.

The data folder is 0700; the SQLite database (with its ``-wal`` and ``-shm``
files) and the secret key are 0600; the blob store's folders are 0700 and
its files 0400 (``artifacts.store``), and so are a class-1 tool's folders and
files (``tasks.tools``). ``db_files_private`` runs on every new
SQLite connection (SQLite gives ``-wal`` and ``-shm`` the database file's own
mode), and ``pippa_doctor`` reports anything looser (``--repair`` tightens
it, ``loose_paths``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from django.conf import settings

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
SQLITE_SUFFIXES = ("", "-wal", "-shm")


def is_loose(mode: int) -> bool:
    """Whether group or others may do anything with it."""
    return bool(stat.S_IMODE(mode) & 0o077)


def _sqlite_path() -> str | None:
    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("sqlite3"):
        return None
    name = os.fspath(db["NAME"])
    return None if name == ":memory:" or name.startswith("file:") else name


def private_paths() -> list[tuple[Path, int]]:
    """(path, the mode it should have) for the data folder, the database's
    files and the secret key, those that exist."""
    wanted = [(Path(settings.DATA_DIR), PRIVATE_DIR)]
    wanted.append((Path(settings.DATA_DIR) / "secret_key", PRIVATE_FILE))
    name = _sqlite_path()
    if name:
        wanted += [(Path(name + suffix), PRIVATE_FILE) for suffix in SQLITE_SUFFIXES]
    return [(path, mode) for path, mode in wanted if path.exists()]


def loose_paths() -> list[tuple[Path, int]]:
    """The private paths whose mode lets group or others in, with the mode
    each should have."""
    loose = []
    for path, mode in private_paths():
        try:
            if is_loose(path.stat().st_mode):
                loose.append((path, mode))
        except FileNotFoundError:
            pass
    return loose


def db_files_private(sender, connection, **kwargs) -> None:
    """``connection_created``: a SQLite database file (and its WAL and shared
    memory files) readable by this account only. A few stats per connection."""
    if connection.vendor != "sqlite":
        return
    name = connection.settings_dict["NAME"]
    if not name or str(name) == ":memory:" or str(name).startswith("file:"):
        return
    for suffix in SQLITE_SUFFIXES:
        path = os.fspath(name) + suffix
        try:
            if is_loose(os.stat(path).st_mode):
                os.chmod(path, PRIVATE_FILE)
        except FileNotFoundError:
            pass
