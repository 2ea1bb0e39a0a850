"""``make run`` keeps its step worker alive: a killed worker is started again
within seconds, and it takes the queued tasks (the audit of b2149bc found a
killed worker never came back: tasks stayed queued, notifications stopped, and
the task page still said the next worker would take over)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.models import Task
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every process below ``pid``."""
    children: dict[int, list[int]] = {}
    lines: dict[int, str] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        child = int(status.parent.name)
        children.setdefault(int(fields[1]), []).append(child)
        lines[child] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = lines.get(child, "")
            todo.append(child)
    return found


def _workers(pid: int) -> set[int]:
    return {p for p, line in _descendants(pid).items() if "pippa_worker" in line}


def _wait(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    return condition()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_killed_worker_under_make_run_is_started_again_and_takes_queued_tasks(
    transactional_db, subprocess_env, tool_log, make_conversation, user
):
    from tasks.plan import task_create

    port = _free_port()
    env = {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.tools",
        "PIPPA_TOOL_LOG": str(tool_log),
    }
    env.pop("MAKEFLAGS", None)
    make = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"PORT={port}", "HOST=127.0.0.1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        first = _wait(lambda: _workers(make.pid), 240)
        assert first, "make run started no worker"

        def answering() -> bool:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/login/", timeout=2
                ):
                    return True
            except OSError:
                return False

        assert _wait(answering, 120), "make run's web server did not answer"
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        second = _wait(lambda: _workers(make.pid) - first, 10)
        restarted_in = time.monotonic() - killed_at

        task = task_create(
            conversation=make_conversation(owner=user),
            title="queued after the kill",
            steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
        )
        done = _wait(
            lambda: Task.objects.get(pk=task.pk).status == Task.Status.DONE, 60
        )
    finally:
        os.killpg(make.pid, signal.SIGINT)
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()

    assert second, "no worker was started again within 10 s"
    assert restarted_in < 10
    assert done, "the new worker did not take the queued task"
    assert answering() is False  # Ctrl-C stopped the web server too
