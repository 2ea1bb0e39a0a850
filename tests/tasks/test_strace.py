"""The order on disk, seen from outside: a worker runs under ``strace``.

A step whose tool has outside effects must have its ``tool_call_started``
commit synced before the tool does anything, and the payload file and its
folder must be synced before the commit that names them. On SQLite the sync
is the worker's own (``fdatasync``/``fsync`` of the WAL); on PostgreSQL it is
the server's, and the worker's connection must run with
``synchronous_commit`` on.

strace is Debian's (``.ci/install-strace`` installs it); without it the test
says so and skips.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from django.db import connection

from tasks.models import Event, Step
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.workers import worker_argv

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STRACE = shutil.which("strace")
SYNCS = ("fsync", "fdatasync")
# One strace line: pid, call, first argument's fd and path (-y), the rest.
LINE = re.compile(r"^(?:\[pid\s+)?(\d+)\]?\s+(\w+)\((\d+)<([^>]*)>(.*)$")


def _trace(lines: list[str]) -> list[tuple[str, str, str]]:
    """(call, path of its fd, rest of the line) for each traced call, in order."""
    calls = []
    for line in lines:
        match = LINE.match(line)
        if match:
            calls.append((match.group(2), match.group(4), match.group(5)))
    return calls


def _first(calls, start: int, test) -> int:
    for i in range(start, len(calls)):
        if test(*calls[i]):
            return i
    raise AssertionError(f"not found after call {start}")


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="the worker's own syncs are SQLite's"
)
@pytest.mark.skipif(
    STRACE is None,
    reason="strace is not installed: apt-get install -y strace (.ci/install-strace)",
)
def test_the_call_is_synced_before_it_goes_out_and_the_file_before_its_name(
    make_conversation, subprocess_env, tmp_path, settings, tool_log
):
    task = task_create(
        conversation=make_conversation(),
        title="notify",
        steps=[{"title": "send", "tool": "test.effect", "args": {}}],
    )
    log = tool_log
    out = tmp_path / "strace.txt"
    env = {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.tools",
        "PIPPA_TOOL_LOG": str(log),
    }
    proc = subprocess.run(
        [
            STRACE,
            "-f",
            "-y",
            "-x",
            "-s",
            "65536",
            "-e",
            "trace=write,pwrite64,fsync,fdatasync,link,linkat",
            "-o",
            str(out),
            *worker_argv(task.pk),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert Step.objects.get(task=task).status == "done"
    sha = Event.objects.get(task=task, kind="payload_persisted").data["sha"]
    calls = _trace(out.read_text(errors="replace").splitlines())

    def wal_write(marker):
        # -x prints a binary buffer (a WAL frame) as hex escapes throughout.
        hexed = "".join(f"\\x{byte:02x}" for byte in marker.encode())
        return lambda call, path, rest: (
            call in ("write", "pwrite64") and path.endswith("-wal") and hexed in rest
        )

    def wal_sync(call, path, rest):
        return call in SYNCS and path.endswith("-wal")

    # 1. tool_call_started reaches the WAL, the WAL is synced, then the tool
    #    writes for the first time (its note in the side channel).
    started = _first(calls, 0, wal_write("tool_call_started"))
    synced = _first(calls, started, wal_sync)
    first_tool_write = _first(
        calls, 0, lambda call, path, rest: call == "write" and path == str(log)
    )
    assert started < synced < first_tool_write

    # 2. The payload file (made in tmp/ with no name) is linked under its
    #    sha, then it and its folder are synced; only then does the commit
    #    that names it reach the WAL, and that commit is synced before the
    #    worker moves on.
    linked = _first(
        calls,
        first_tool_write,
        lambda call, path, rest: call == "linkat" and sha in rest,
    )
    file_sync = _first(
        calls,
        linked,
        lambda call, path, rest: call in SYNCS and "/tmp/#" in path,
    )
    folder = str(settings.BLOB_DIR / sha[:2])
    folder_sync = _first(
        calls, file_sync, lambda call, path, rest: call in SYNCS and path == folder
    )
    named = _first(calls, 0, wal_write("payload_persisted"))
    assert linked < file_sync < folder_sync < named
    # That commit names the file's sha, and is synced before the worker ends.
    commit_synced = _first(calls, named, wal_sync)
    assert folder_sync < _first(calls, folder_sync, wal_write(sha)) < commit_synced


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's synchronous_commit"
)
def test_the_workers_postgresql_connection_runs_with_synchronous_commit_on(
    subprocess_env,
):
    """Even on a database whose own default is off, the worker's commits wait
    for the server's disk."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    try:
        shown = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "shell",
                "-c",
                "from django.db import connection\n"
                "c = connection.cursor()\n"
                "c.execute('SHOW synchronous_commit')\n"
                "print(c.fetchone()[0])",
            ],
            cwd=REPO,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1] == "on"
