"""A bounded randomized soak: a few hundred SIGKILLs at random moments, invariants after each.

``PIPPA_SOAK_KILLS`` raises the number of kills (default 300); the child
forks one worker life per kill, so start-up cost is paid once.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tasks.models import Step, Task
from tasks.plan import task_create
from tasks.tools import tools_load
from tests.conftest import REPO

KILLS = int(os.environ.get("PIPPA_SOAK_KILLS", "300"))
PATTERN = [
    {"title": "fetch", "tool": "test.fetch", "args": {"size": 1024}},
    {"title": "file", "tool": "test.file", "args": {"size": 1024}},
    {"title": "snapshot", "tool": "test.snapshot", "args": {"size": 1024}},
]


def plan(repeats: int) -> list[dict]:
    steps = []
    for r in range(repeats):
        for entry in PATTERN:
            steps.append({**entry, "max_attempts": 1000})
        # A render of this round's fetch.
        steps.append(
            {
                "title": "render",
                "tool": "test.render",
                "args": {"source": 4 * r + 1},
                "max_attempts": 1000,
            }
        )
    return steps


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_hundreds_of_random_kills_lose_nothing_and_break_no_class_rule(
    make_conversation, subprocess_env, python_exe, tmp_path
):
    tools_load(["tests.support.tools"])
    conversation = make_conversation()
    n_tasks = max(10, KILLS // 4)
    for i in range(n_tasks):
        task_create(conversation=conversation, title=f"soak {i}", steps=plan(4))
    summary_file = tmp_path / "soak.json"
    env = {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.tools",
        "PIPPA_TOOL_LOG": str(tmp_path / "tool-calls.jsonl"),
    }
    proc = subprocess.run(
        [python_exe, "-m", "tests.support.soak", str(summary_file), str(KILLS), "7"],
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
    assert summary["unfinished"] == 0
    # The kills interrupted real progress, not an idle loop.
    assert summary["steps_done_under_fire"] >= KILLS
    assert Task.objects.exclude(status="done").count() == 0
    assert not Step.objects.exclude(status="done").exists()
    print(summary)
