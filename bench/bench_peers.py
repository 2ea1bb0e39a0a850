"""The executor beside the systems a user would pick instead, in the same run.

1,000 sequential steps of a 1 KiB payload on SQLite for each of: our executor,
LangGraph with its SQLite checkpointer (``durability="sync"``), DBOS on SQLite,
the Django ORM doing one UPDATE and three INSERTs per step, and raw ``sqlite3``
doing our writes (see ``bench/peers.py``). Each run is a fresh process on a
fresh data dir; the systems take turns within each repetition so a swing in
the disk's fsync latency hits all of them; figures are medians.

Two passes: with real fsync (steps/s, what a user waits for), and under
Debian's ``eatmydata``, which makes fsync a no-op for every side alike
(µs/step: software cost, stable on a noisy disk). Each system runs as shipped
and, for ours and LangGraph, also at ``synchronous=NORMAL``: ours is WAL,
FULL except the start of a call without outside effects, plus the payload
file's two fsyncs (every output is a file); LangGraph's saver sets WAL and
leaves synchronous at FULL; DBOS keeps SQLite's rollback journal and runs
under an interpreter of its own (Python 3.11: its SQLite system database
fails to launch under 3.12 and 3.13).
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
    "pippa": "Pippa executor as shipped (every output a file, FULL)",
    "pippa_normal": "Pippa executor, PIPPA_SQLITE_SYNCHRONOUS=NORMAL",
    "langgraph": 'LangGraph + SqliteSaver, durability "sync" (as shipped: FULL)',
    "langgraph_normal": "LangGraph + SqliteSaver, synchronous=NORMAL",
    "langgraph_files": 'LangGraph + SqliteSaver "sync", its payload a file like ours',
    "dbos": "DBOS on SQLite (Python 3.11)",
    "orm": "Django ORM, 1 UPDATE + 3 INSERTs/step, no payload file",
    "raw": "raw sqlite3, same writes, files and commits",
}
# (ours, the peer): its targets for software cost and for steps/s.
PEER_TARGETS = {
    ("pippa", "langgraph"): ("<= 1.0 x baseline", ">= 1.0 x baseline"),
    ("pippa_normal", "langgraph_normal"): ("printed beside", "printed beside"),
    ("pippa", "langgraph_files"): ("like for like", "like for like"),
    ("pippa", "dbos"): ("printed beside", "printed beside"),
    ("pippa", "raw"): ("(diagnostic)", "(diagnostic)"),
    ("pippa", "orm"): ("(diagnostic)", "(diagnostic)"),
}
DBOS_VENV = REPO / "var" / "bench-dbos-py311"


def _child(
    system: str, root: Path, template: Path | None, steps: int, eat: bool
) -> float | str:
    """Run one system in a fresh process; return seconds, or why it failed."""
    work = root / f"{system}-{os.urandom(4).hex()}"
    cmd = [sys.executable, "-m", "bench.peers", system, "--dir", str(work)]
    cmd += ["--steps", str(steps)]
    if template is not None:
        cmd += ["--template", str(template)]
    if system == "dbos":
        cmd[0] = _dbos_python()
    if eat:
        cmd = [shutil.which("eatmydata"), *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # The runs before this one leave nothing in flight: their writes are on
    # disk, and their folders stay until the end of the group (``run``), since
    # deleting thousands of files makes the filesystem discard their blocks
    # for a while after, which would slow whichever system runs next.
    os.sync()
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        return "timed out after 600 s"
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def _dbos_python() -> str:
    """The interpreter DBOS runs under: ``DBOS_PYTHON``, or the venv made from
    the machine's Python 3.11 (``_dbos_ready``)."""
    return os.environ.get("DBOS_PYTHON") or str(DBOS_VENV / "bin" / "python")


def _dbos_ready() -> str:
    """Make DBOS's own venv from the machine's python3 when it is 3.11 (once:
    ``pip install dbos`` into var/); return why it cannot run, or ''."""
    python = _dbos_python()
    check = [python, "-c", "import dbos"]
    if (
        Path(python).exists()
        and subprocess.run(check, capture_output=True).returncode == 0
    ):
        return ""
    base = shutil.which("python3", path="/usr/bin:/usr/local/bin") or ""
    version = (
        subprocess.run(
            [base, "-c", "import sys; print(sys.version_info[:2] < (3, 12))"],
            capture_output=True,
            text=True,
        )
        if base
        else None
    )
    if version is None or version.stdout.strip() != "True":
        return "no Python below 3.12 for DBOS 3.4 (set DBOS_PYTHON)"
    print(f"  peers: making DBOS's venv at {DBOS_VENV} (one time)", flush=True)
    made = subprocess.run([base, "-m", "venv", str(DBOS_VENV)], capture_output=True)
    pip = [str(DBOS_VENV / "bin" / "pip"), "install", "-q", "dbos>=3.4"]
    if made.returncode != 0 or subprocess.run(pip, capture_output=True).returncode:
        return "could not install dbos into a Python 3.11 venv"
    return ""


def _available(system: str) -> str:
    """Return why ``system`` cannot run here, or '' when it can."""
    if system == "dbos":
        return _dbos_ready()
    module = {
        "langgraph": "langgraph.checkpoint.sqlite",
        "langgraph_normal": "langgraph.checkpoint.sqlite",
        "langgraph_files": "langgraph.checkpoint.sqlite",
    }.get(system)
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

    for (ours, peer), (soft_target, real_target) in PEER_TARGETS.items():
        ours_soft, ours_real = per_step_us(ours), steps_per_s(ours)
        soft, real = per_step_us(peer), steps_per_s(peer)
        if ours_soft is not None and soft is not None:
            report.add(
                group="peers",
                figure=f"{LABELS[ours]}: software cost (fsync a no-op)",
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
                figure=f"{LABELS[ours]}: steps/s with real fsync",
                value=ours_real,
                baseline_name=LABELS[peer],
                baseline=real,
                unit="steps/s",
                higher_is_better=True,
                target=real_target,
            )
