"""The data folder is the service's account's alone, whatever the umask: the
folder 0700, the database files 0600, the blob folders 0700 and blob files
0400, a class-1 tool's folders 0700 and files 0400; the doctor reports
anything looser and its repair tightens it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from django.db import connection

from artifacts.store import FolderStore
from tasks.doctor import doctor_run
from tasks.models import Event, Step
from tasks.plan import task_create
from tasks.resume import class1_file
from tasks.tools import files_loose_paths, files_root
from tests.conftest import REPO
from tests.support.executing import crash_at, expire_lease, invocations, run_task


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


def _class1_task(conversation, title="a picture"):
    return task_create(
        conversation=conversation,
        title=title,
        steps=[{"title": "write it", "tool": "test.file", "args": {}}],
    )


@pytest.mark.django_db
def test_a_class1_file_is_private_like_a_blob_even_under_an_open_umask(
    make_conversation, tool_log, blob_store
):
    old = os.umask(0)
    try:
        task = _class1_task(make_conversation())
        run_task(task.pk)
    finally:
        os.umask(old)

    payload = Event.objects.get(task=task, kind="payload_persisted").data
    path = class1_file(payload)
    assert Step.objects.get(task=task).status == "done"
    assert mode(path) == 0o400
    assert mode(path.parent) == mode(path.parent.parent) == 0o700
    assert mode(files_root()) == 0o700
    assert mode(blob_store.path(payload["sha"])) == 0o400
    assert files_loose_paths() == []


@pytest.mark.django_db
def test_a_read_only_class1_file_is_written_again_when_its_call_is_made_again(
    make_conversation, tool_log
):
    """A call made again (the file was damaged) replaces the 0400 file whole."""
    task = _class1_task(make_conversation())
    crash_at(task.pk, "after_payload")
    path = class1_file(Event.objects.get(task=task, kind="payload_persisted").data)
    path.chmod(0o600)
    path.write_bytes(b"damaged")
    path.chmod(0o400)
    expire_lease(task.pk)

    run_task(task.pk, worker_id="worker:b")

    the_step = Step.objects.get(task=task)
    assert the_step.status == "done"
    assert invocations(tool_log)[the_step.pk] == 2
    assert path.read_bytes() != b"damaged"
    assert mode(path) == 0o400
    assert not list(path.parent.glob(".*.tmp"))


@pytest.mark.django_db
def test_the_doctor_tightens_a_class1_file_and_folder_someone_opened_up(
    make_conversation, tool_log, blob_store
):
    task = _class1_task(make_conversation())
    run_task(task.pk)
    path = class1_file(Event.objects.get(task=task, kind="payload_persisted").data)
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)

    report = doctor_run(store=blob_store, grace_seconds=3600)
    loose = finding(report, "loose_permissions")
    assert loose.found == 2
    assert any(str(path) in line for line in loose.sample)

    report = doctor_run(repair=True, store=blob_store, grace_seconds=3600)
    loose = finding(report, "loose_permissions")
    assert (loose.repaired, loose.remaining) == (2, 0)
    assert mode(path) == 0o400
    assert mode(path.parent) == 0o700
    assert (
        class1_file(Event.objects.get(task=task, kind="payload_persisted").data) == path
    )  # still its own account's to read, and intact
