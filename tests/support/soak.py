"""Child process for the randomized crash soak.

Usage: python -m tests.support.soak SUMMARY_JSON KILLS SEED CONVERSATION_ID [faults]

Work is topped up in small batches (tasks of mixed classes in CONVERSATION_ID)
whenever nothing is runnable, so the number of kills, not the size of a
pre-made backlog, bounds the run.

A "zygote": it sets Django up once, then forks one worker life after another.
Each life steps runnable tasks and is SIGKILLed at a random moment: either at
a random envelope boundary (``PIPPA_CRASHPOINT`` in ``random`` mode, armed in
the child after the fork) or by the zygote after a random delay, which lands
anywhere (mid-transaction, mid-blob-write). After each death the zygote lets
the lease expire (as time would), and checks the invariants of the task the
dead life held, so every resume is checked by the next round. On PostgreSQL
it first waits for the dead life's sessions to end: the server finishes a
COMMIT that was in flight at the kill, and a lease taken by it would
otherwise outlive the zygote's "time passes". Forking keeps
Python start-up out of the loop, so a few hundred kills take seconds.

With ``faults`` (and ``PIPPA_SOAK_FILL`` naming a file on a small tmpfs that
holds the blob folder), about one life in three meets a fault that is not a
crash instead: the blob disk fills up at a random moment (the zygote writes
the filler, and frees it after the life), or the database goes away (on
PostgreSQL the zygote terminates the life's sessions; on SQLite it holds the
write lock past the life's short busy timeout). A life that meets a fault
does what a worker does, stops stepping (exit code 3), and may still be
SIGKILLed; the next lives resume what it left by class.

Writes a JSON summary; exits non-zero on the first broken invariant.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

import django


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
    django.setup()
    from django.db import connection, connections

    from tasks import executor
    from tasks.models import Task
    from tasks.tools import tools_load
    from tests.support.executing import check_invariants, invocations

    summary_path, kills_wanted, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conversation_id = int(sys.argv[4])
    faults = len(sys.argv) > 5 and sys.argv[5] == "faults"
    tools_load(["tests.support.tools"])
    rng = random.Random(seed)
    summary = {"lives": 0, "kills": 0, "boundary_kills": 0, "timer_kills": 0}
    if faults:
        summary.update({"disk_faults": 0, "db_faults": 0, "faults_met": 0})
    filler = Path(os.environ.get("PIPPA_SOAK_FILL", "/nonexistent/filler"))
    started = time.monotonic()
    try:
        while summary["kills"] < kills_wanted:
            if not Task.objects.runnable().exists():
                _top_up(conversation_id, summary)
            life = summary["lives"]
            worker_id = f"soak:{life}"
            fault = rng.choice(["disk", "db"]) if faults and rng.random() < 0.35 else ""
            by_timer = fault != "" or rng.random() < 0.5
            delay = rng.uniform(0.0, 0.04)
            connections.close_all()
            blocker = None
            if fault == "db" and connection.vendor == "sqlite":
                blocker = _sqlite_lock()
            pid = os.fork()
            if pid == 0:  # the worker life
                os._exit(_life(executor, Task, worker_id, by_timer, fault, seed, life))
            if fault:
                summary[f"{fault}_faults"] += 1
                delay = _inject(fault, blocker, filler, rng)
            if by_timer:
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        break
                    time.sleep(0.002)
                else:
                    os.kill(pid, signal.SIGKILL)
                    done, status = os.waitpid(pid, 0)
            else:
                _, status = os.waitpid(pid, 0)
            if blocker is not None:
                blocker.execute("ROLLBACK")
                blocker.close()
            filler.unlink(missing_ok=True)
            summary["lives"] += 1
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                summary["kills"] += 1
                summary["timer_kills" if by_timer else "boundary_kills"] += 1
            elif os.WEXITSTATUS(status) == FAULT_MET and faults:
                summary["faults_met"] += 1
            elif os.WEXITSTATUS(status) != 0:
                raise AssertionError(f"life {life} failed (exit {status})")
            if connection.vendor == "postgresql":
                # A life killed with its COMMIT in flight has that commit
                # finished by the server after the kill, perhaps after the
                # lines below (a lease taken then would stay live): wait for
                # its sessions to end, as time would.
                from tests.support.faults import pg_wait_sessions_gone

                pg_wait_sessions_gone(connection, LIFE_APP)
            held = list(
                Task.objects.filter(lease_owner=worker_id).values_list("pk", flat=True)
            )
            # Time passes: the dead worker's lease expires.
            Task.objects.filter(lease_owner=worker_id).update(lease_expires_at=_past())
            check_invariants(held)
        # Finish everything with a clean worker, then check the whole database.
        filler.unlink(missing_ok=True)
        connections.close_all()
        from tasks.models import Step

        summary["steps_done_under_fire"] = Step.objects.filter(status="done").count()
        for task in Task.objects.runnable():
            while True:
                outcome = executor.step(task_id=task.pk, worker_id="soak:final")
                if outcome is None or outcome.task_status != "running":
                    break
        check_invariants()
        _check_calls_follow_starts(invocations(_log_path()))
        left = Task.objects.exclude(status="done")
        summary["unfinished"] = left.count()
        # What a failing run left, for its message: each task and its steps.
        summary["left"] = [
            {
                "task": t.pk,
                "status": t.status,
                "lease_owner": t.lease_owner,
                "steps": list(
                    t.steps.order_by("position").values_list(
                        "position", "status", "attempts", "max_attempts", "error"
                    )
                ),
            }
            for t in left[:5]
        ]
        summary["calls"] = sum(invocations(_log_path()).values())
        summary["seconds"] = round(time.monotonic() - started, 1)
    except BaseException:
        summary["error"] = traceback.format_exc()
        with open(summary_path, "w") as fh:
            json.dump(summary, fh)
        return 1
    with open(summary_path, "w") as fh:
        json.dump(summary, fh)
    return 0


PATTERN = [
    {"title": "fetch", "tool": "test.fetch", "args": {"size": 1024}},
    {"title": "file", "tool": "test.file", "args": {"size": 1024}},
    {"title": "snapshot", "tool": "test.snapshot", "args": {"size": 1024}},
]


def soak_plan(repeats: int) -> list[dict]:
    """Rounds of fetch (2), file (1), snapshot (3) and a render (4) of the fetch."""
    steps = []
    for r in range(repeats):
        steps += [{**entry, "max_attempts": 1000} for entry in PATTERN]
        steps.append(
            {
                "title": "render",
                "tool": "test.render",
                "args": {"source": 4 * r + 1},
                "max_attempts": 1000,
            }
        )
    return steps


FAULT_MET = 3
LIFE_APP = "pippa-soak-life"


def _life(executor, Task, worker_id, by_timer, fault, seed, life) -> int:
    """One worker life in the forked child: step a few runnable tasks.

    Like ``pippa_worker``, a life that meets a store or database fault stops
    stepping (a worker would back off); it exits with ``FAULT_MET``.
    """
    from django.db import DatabaseError, connection

    from tasks import crashpoints

    try:
        if fault == "db" and connection.vendor == "sqlite":
            # A short busy timeout: the zygote's write lock outlasts it.
            connection.settings_dict["OPTIONS"]["timeout"] = 0.05
        elif connection.vendor == "postgresql":
            # Named, so the zygote can cut this life's sessions and no one
            # else's, and wait for them to end after the life's death.
            connection.settings_dict.setdefault("OPTIONS", {})["application_name"] = (
                LIFE_APP
            )
        if not by_timer:
            crashpoints.arm(f"random:0.06:{seed * 100003 + life}")
        for task in Task.objects.runnable().order_by("?")[:5]:
            while True:
                outcome = executor.step(task_id=task.pk, worker_id=worker_id)
                if outcome is not None and outcome.fault:
                    return FAULT_MET
                if outcome is None or outcome.task_status != "running":
                    break
    except DatabaseError:
        return FAULT_MET
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _sqlite_lock():
    """Take SQLite's write lock from a second connection (released after the life)."""
    import sqlite3

    from django.db import connection

    blocker = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    return blocker


def _inject(fault: str, blocker, filler: Path, rng: random.Random) -> float:
    """Make the fault happen to the running life; return how long to let it run."""
    time.sleep(rng.uniform(0.0, 0.03))
    if fault == "disk":
        from tests.support.faults import fill

        fill(filler)
    elif blocker is not None:
        time.sleep(rng.uniform(0.0, 0.05))
        blocker.execute("ROLLBACK")
        blocker.execute("BEGIN")  # closed by the zygote after the life
    else:
        from django.db import connection

        from tests.support.faults import pg_terminate_others

        time.sleep(rng.uniform(0.0, 0.05))
        pg_terminate_others(connection, application_name=LIFE_APP)
        connection.close()
    return 0.3


def _top_up(conversation_id: int, summary: dict, tasks: int = 8) -> None:
    from tasks.models import Conversation
    from tasks.plan import task_create

    conversation = Conversation.objects.get(pk=conversation_id)
    for _ in range(tasks):
        task_create(
            conversation=conversation,
            title=f"soak {summary.get('tasks', 0)}",
            steps=soak_plan(2),
        )
        summary["tasks"] = summary.get("tasks", 0) + 1


def _check_calls_follow_starts(calls) -> None:
    """Every real call had its ``tool_call_started`` committed first."""
    from collections import Counter

    from tasks.models import Event

    starts = Counter(
        Event.objects.filter(kind="tool_call_started").values_list("step_id", flat=True)
    )
    for step_id, n in calls.items():
        assert n <= starts[step_id], (
            f"step {step_id}: {n} calls, {starts[step_id]} starts"
        )


def _past():
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() - timedelta(seconds=1)


def _log_path():
    from pathlib import Path

    return Path(os.environ.get("PIPPA_TOOL_LOG", "/nonexistent"))


if __name__ == "__main__":
    sys.exit(main())
