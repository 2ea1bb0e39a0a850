"""Every connection is configured the same: FKs on, WAL, busy timeout, IMMEDIATE."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from django.db import connection, connections, transaction

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite pragmas; PostgreSQL has its own"
)


def _pragmas() -> dict[str, object]:
    conn = connections["default"]
    with conn.cursor() as cursor:
        values = {}
        for pragma in ("foreign_keys", "journal_mode", "busy_timeout", "synchronous"):
            cursor.execute(f"PRAGMA {pragma}")
            values[pragma] = cursor.fetchone()[0]
    conn.close()
    return values


@pytest.mark.django_db(transaction=True)
def test_every_thread_connection_has_foreign_keys_wal_and_busy_timeout():
    results: list[dict] = []
    errors: list[BaseException] = []

    def worker():
        try:
            results.append(_pragmas())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 6
    for values in results:
        assert values["foreign_keys"] == 1
        assert str(values["journal_mode"]).lower() == "wal"
        assert values["busy_timeout"] >= 20_000
        assert values["synchronous"] == 2  # FULL: every commit on disk (the default)


@pytest.mark.django_db(transaction=True)
def test_a_django_transaction_takes_the_write_lock_at_begin():
    """Inside atomic(), before any write, another writer is already locked out."""
    path = connection.settings_dict["NAME"]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # a read only: the lock is from BEGIN IMMEDIATE
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()


def _settings_in_child(env: dict[str, str], code: str):
    import os
    import subprocess
    import sys

    from django.conf import settings

    return subprocess.run(
        [sys.executable, "-c", code],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "pippa_site.settings",
            "PIPPA_DATA_DIR": str(settings.DATA_DIR),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_synchronous_is_full_by_default_normal_on_request_and_a_wrong_value_is_refused(
    tmp_path,
):
    show = (
        "import django; django.setup(); from django.db import connection; "
        "c = connection.cursor(); c.execute('PRAGMA synchronous'); "
        "print(c.fetchone()[0])"
    )
    db = {"PIPPA_SQLITE_PATH": str(tmp_path / "db.sqlite3")}
    full = _settings_in_child(db, show)
    assert full.stdout.strip() == "2", full.stderr  # FULL: every commit synced
    normal = _settings_in_child({**db, "PIPPA_SQLITE_SYNCHRONOUS": "normal"}, show)
    assert normal.stdout.strip() == "1", normal.stderr
    wrong = _settings_in_child({**db, "PIPPA_SQLITE_SYNCHRONOUS": "OFF"}, show)
    assert wrong.returncode != 0
    assert "PIPPA_SQLITE_SYNCHRONOUS must be NORMAL or FULL" in wrong.stderr
