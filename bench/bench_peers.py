"""The executor beside the systems a user would pick instead, in the same run.

1,000 sequential steps of a 1 KiB payload on SQLite for each of: our executor,
LangGraph with its SQLite checkpointer (``durability="sync"``), DBOS on SQLite,
the Django ORM doing one UPDATE and three INSERTs per step, and raw ``sqlite3``
doing our writes (see ``bench/peers.py``). Each run is a fresh process on a
fresh data dir; the systems take turns within each repetition so a swing in
the disk's fsync latency hits all of them; figures are medians.

Two passes: with real fsync (steps/s, what a user waits for), and under
Debian's ``eatmydata``, which makes fsync a no-op for every side alike
(µs/step: software cost, stable on a noisy disk). Each system keeps its own
SQLite settings as shipped: ours is WAL with synchronous=NORMAL plus the blob's
two fsyncs; LangGraph's saver sets WAL and leaves synchronous at FULL; DBOS
keeps SQLite's rollback journal.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from bench.harness import Report
from bench.peers import REPO, SYSTEMS

LABELS = {
    "pippa": "Pippa executor (tasks.executor.step)",
    "pippa_full": "Pippa executor, SQLite synchronous=FULL",
    "langgraph": 'LangGraph + SqliteSaver, durability "sync"',
    "dbos": "DBOS on SQLite",
    "orm": "Django ORM, 1 UPDATE + 3 INSERTs/step, no payload file",
    "raw": "raw sqlite3, same writes (1 KiB payload inline)",
}
PEER_TARGETS = {
    "langgraph": ("<= 1.0 x baseline", ">= 1.0 x baseline"),
    "dbos": ("printed beside", "printed beside"),
    "raw": ("(diagnostic)", "(diagnostic)"),
    "orm": ("(diagnostic)", "(diagnostic)"),
}


def _child(
    system: str, root: Path, template: Path | None, steps: int, eat: bool
) -> float | str:
    """Run one system in a fresh process; return seconds, or why it failed."""
    work = root / f"{system}-{os.urandom(4).hex()}"
    cmd = [sys.executable, "-m", "bench.peers", system, "--dir", str(work)]
    cmd += ["--steps", str(steps)]
    if template is not None:
        cmd += ["--template", str(template)]
    if eat:
        cmd = [shutil.which("eatmydata"), *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        return "timed out after 600 s"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def _available(system: str) -> str:
    """Return why ``system`` cannot run here, or '' when it can."""
    module = {"langgraph": "langgraph.checkpoint.sqlite", "dbos": "dbos"}.get(system)
    if module is None:
        return ""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return "" if found else f"{module} not installed (pip install -e '.[bench]')"


def run(report: Report) -> None:
    steps = 300 if report.quick else 1000
    repeat = 1 if report.quick else 3
    root = Path(settings.DATA_DIR) / "peers"
    root.mkdir(parents=True, exist_ok=True)
    prepared = subprocess.run(
        [sys.executable, "-m", "bench.peers", "prepare", "--dir", str(root / "t")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    template = Path(json.loads(prepared.stdout.strip().splitlines()[-1])["template"])

    systems = []
    for system in SYSTEMS:
        why = _available(system)
        if why:
            print(f"  peers: {LABELS[system]} skipped: {why}", flush=True)
        else:
            systems.append(system)
    modes = [("fsync", False)]
    if shutil.which("eatmydata"):
        modes.append(("no-fsync", True))
    else:
        print(
            "  peers: eatmydata not found (apt-get install eatmydata); "
            "software-cost figures skipped",
            flush=True,
        )

    seconds: dict[tuple[str, str], list[float]] = {}
    failed: dict[str, str] = {}
    for mode, eat in modes:
        for rep in range(repeat):
            # Rotate the order so no system always runs first or last.
            order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
            for system in order:
                if system in failed:
                    continue
                result = _child(system, root, template, steps, eat)
                if isinstance(result, str):
                    failed[system] = result
                    print(f"  peers: {LABELS[system]} failed: {result}", flush=True)
                    continue
                seconds.setdefault((system, mode), []).append(result)
                print(
                    f"  peers: {mode} rep {rep + 1}: {system} "
                    f"{result / steps * 1e6:,.0f} us/step",
                    flush=True,
                )
    shutil.rmtree(root, ignore_errors=True)

    def per_step_us(system: str) -> float | None:
        runs = seconds.get((system, "no-fsync"))
        return statistics.median(runs) / steps * 1e6 if runs else None

    def steps_per_s(system: str) -> float | None:
        runs = seconds.get((system, "fsync"))
        return steps / statistics.median(runs) if runs else None

    lines = [
        f"Peers: {steps:,} sequential steps, 1 KiB payload, SQLite, fresh process "
        f"each, median of {repeat}",
        "",
        "| system | us/step, fsync a no-op (software cost) | steps/s with real fsync |",
        "|---|---|---|",
    ]
    for system in SYSTEMS:
        soft, real = per_step_us(system), steps_per_s(system)
        lines.append(
            f"| {LABELS[system]} | {'n/a' if soft is None else f'{soft:,.0f}'} | "
            f"{'n/a' if real is None else f'{real:,.0f}'} |"
        )
    report.sections.append("\n".join(lines))

    ours_soft, ours_real = per_step_us("pippa"), steps_per_s("pippa")
    for peer, (soft_target, real_target) in PEER_TARGETS.items():
        soft, real = per_step_us(peer), steps_per_s(peer)
        if ours_soft is not None and soft is not None:
            report.add(
                group="peers",
                figure="executor software cost (fsync a no-op)",
                value=ours_soft,
                baseline_name=LABELS[peer],
                baseline=soft,
                unit="us/step",
                higher_is_better=False,
                target=soft_target,
            )
        if ours_real is not None and real is not None:
            report.add(
                group="peers",
                figure="executor steps/s with real fsync",
                value=ours_real,
                baseline_name=LABELS[peer],
                baseline=real,
                unit="steps/s",
                higher_is_better=True,
                target=real_target,
            )
    # Like for like on durability: ours with every commit synced, as
    # LangGraph's saver runs SQLite (synchronous=FULL).
    full, lg = steps_per_s("pippa_full"), steps_per_s("langgraph")
    if full is not None and lg is not None:
        report.add(
            group="peers",
            figure="executor steps/s, real fsync, SQLite synchronous=FULL",
            value=full,
            baseline_name=LABELS["langgraph"],
            baseline=lg,
            unit="steps/s",
            higher_is_better=True,
            target="printed beside",
        )
