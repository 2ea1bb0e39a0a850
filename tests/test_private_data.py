"""The data folder is the service's account's alone, whatever the umask: the
folder 0700, the database files 0600, the blob folders 0700 and blob files
0400; the doctor reports anything looser and its repair tightens it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from django.db import connection

from artifacts.store import FolderStore
from tasks.doctor import doctor_run
from tests.conftest import REPO


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def finding(report, key):
    return next(f for f in report.findings if f.key == key)


def test_blobs_are_private_even_under_an_open_umask(tmp_path):
    store = FolderStore(tmp_path / "blobs")
    old = os.umask(0)
    try:
        put = store.put_bytes(b"the household's bank statement")
    finally:
        os.umask(old)
    assert mode(store.path(put.sha256)) == 0o400
    assert mode(store.root) == mode(store.tmp_dir) == 0o700
    assert mode(store.path(put.sha256).parent) == 0o700
    assert store.loose_paths() == []


@pytest.mark.slow
def test_a_fresh_data_folder_and_its_database_are_private_under_an_open_umask(
    tmp_path,
):
    data = tmp_path / "data"
    code = (
        "import os; os.umask(0); import django; django.setup(); "
        "from django.core.management import call_command; "
        "call_command('migrate', verbosity=0); "
        "from artifacts.store import default_store; "
        "default_store().put_bytes(b'x')"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "DJANGO_SETTINGS_MODULE": "pippa_site.settings",
        "PIPPA_DATA_DIR": str(data),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert mode(data) == 0o700
    assert mode(data / "pippa.sqlite3") == 0o600
    assert mode(data / "secret_key") == 0o600
    assert mode(data / "blobs") == 0o700
    for path in (data / "blobs").rglob("*"):
        assert mode(path) & 0o077 == 0, path
    for suffix in ("-wal", "-shm"):
        if (data / f"pippa.sqlite3{suffix}").exists():
            assert mode(data / f"pippa.sqlite3{suffix}") == 0o600


@pytest.mark.django_db
def test_the_doctor_reports_loose_permissions_and_repair_tightens_them(
    settings, blob_store
):
    put = blob_store.put_bytes(b"a payload someone made readable")
    blob = blob_store.path(put.sha256)
    os.chmod(blob, 0o644)
    os.chmod(blob.parent, 0o755)
    os.chmod(settings.DATA_DIR, 0o755)
    sqlite = connection.vendor == "sqlite"
    if sqlite:
        os.chmod(connection.settings_dict["NAME"], 0o644)

    report = doctor_run(store=blob_store, grace_seconds=3600)
    loose = finding(report, "loose_permissions")
    assert loose.found == (4 if sqlite else 3)
    assert any(str(blob) in line for line in loose.sample)

    report = doctor_run(repair=True, store=blob_store, grace_seconds=3600)
    loose = finding(report, "loose_permissions")
    assert (loose.repaired, loose.remaining) == (loose.found, 0)
    assert mode(blob) == 0o400
    assert mode(blob.parent) == 0o700
    assert mode(settings.DATA_DIR) == 0o700
    if sqlite:
        assert mode(connection.settings_dict["NAME"]) == 0o600
    assert blob_store.verify(put.sha256)  # still readable by its own account
