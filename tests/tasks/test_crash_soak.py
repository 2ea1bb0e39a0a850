"""A bounded randomized soak: a few hundred SIGKILLs at random moments, invariants after each.

``PIPPA_SOAK_KILLS`` raises the number of kills (default 300); the child
forks one worker life per kill, so start-up cost is paid once. The fault
mode (``PIPPA_SOAK_FAULT_KILLS``, default 150) mixes full disks and lost
databases in with the kills.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tasks.models import Step, Task
from tests.conftest import REPO

KILLS = int(os.environ.get("PIPPA_SOAK_KILLS", "300"))
FAULT_KILLS = int(os.environ.get("PIPPA_SOAK_FAULT_KILLS", "150"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_hundreds_of_random_kills_lose_nothing_and_break_no_class_rule(
    make_conversation, subprocess_env, python_exe, tmp_path
):
    conversation = make_conversation()
    summary_file = tmp_path / "soak.json"
    env = {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.tools",
        "PIPPA_TOOL_LOG": str(tmp_path / "tool-calls.jsonl"),
    }
    proc = subprocess.run(
        [
            python_exe,
            "-m",
            "tests.support.soak",
            str(summary_file),
            str(KILLS),
            "7",
            str(conversation.pk),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = json.loads(summary_file.read_text())
    assert proc.returncode == 0, summary.get("error") or proc.stderr[-3000:]
    assert summary["kills"] >= KILLS, summary
    assert summary["boundary_kills"] > 0
    assert summary["timer_kills"] > 0
    assert summary["unfinished"] == 0, summary["left"]
    # The kills interrupted real progress, not an idle loop.
    assert summary["steps_done_under_fire"] >= KILLS
    assert Task.objects.exclude(status="done").count() == 0
    assert not Step.objects.exclude(status="done").exists()
    print(summary)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_kills_mixed_with_full_disks_and_lost_databases_still_lose_nothing(
    make_conversation, subprocess_env, python_exe, tmp_path, tmpfs
):
    fs = tmpfs("soakfs", 32 * 1024 * 1024)
    conversation = make_conversation()
    summary_file = tmp_path / "soak.json"
    env = {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.tools",
        "PIPPA_TOOL_LOG": str(tmp_path / "tool-calls.jsonl"),
        "PIPPA_BLOB_DIR": str(fs.root / "blobs"),
        "PIPPA_SOAK_FILL": str(fs.filler),
        # A class-1 tool that cannot write its file has failed: retry at once.
        "PIPPA_RETRY_BASE_SECONDS": "0",
    }
    proc = subprocess.run(
        [
            python_exe,
            "-m",
            "tests.support.soak",
            str(summary_file),
            str(FAULT_KILLS),
            "11",
            str(conversation.pk),
            "faults",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = json.loads(summary_file.read_text())
    assert proc.returncode == 0, summary.get("error") or proc.stderr[-3000:]
    assert summary["kills"] >= FAULT_KILLS, summary
    assert summary["disk_faults"] > 0, summary
    assert summary["db_faults"] > 0, summary
    # Lives really met the faults (and stopped as a worker would).
    assert summary["faults_met"] > 0, summary
    assert summary["unfinished"] == 0, summary["left"]
    assert Task.objects.exclude(status="done").count() == 0
    assert not Step.objects.exclude(status="done").exists()
    print(summary)
