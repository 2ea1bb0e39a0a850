"""Crash points: make a process die at an envelope boundary, for tests and the demo.

Nothing is armed unless someone arms it: a test calls ``arm``, the demo arms
one with ``action="raise"``, and the ``pippa_worker`` and ``pippa_mcp``
commands arm the one their ``--crashpoint`` option (or ``PIPPA_CRASHPOINT``)
names. Importing a module never arms anything.

A spec is ``<boundary>[:<n>]`` (die the n-th time the boundary is reached) or
``random:<p>[:<seed>]`` (die at any boundary with probability p).
"""

from __future__ import annotations

import os
import random
import signal
from dataclasses import dataclass

ENV = "PIPPA_CRASHPOINT"

BOUNDARIES = (
    "before_started_commit",  # inside the transaction that logs tool_call_started
    "after_started",  # tool_call_started committed, tool not yet called
    "after_tool",  # tool returned, payload file not yet written
    "after_blob",  # payload file and folder fsynced; the result not committed
    "after_result",  # payload_persisted + tool_result_persisted committed
)
# After the result: inside the transaction that writes a widget's preview row,
# the widget's record of it and the task's keeper link (all or none).
PREVIEW_BOUNDARY = "before_preview_commit"


class SimulatedCrash(BaseException):
    """Raised instead of SIGKILL when the crash point's action is ``raise`` (demo)."""


@dataclass
class _CrashPlan:
    name: str = ""
    count: int = 1
    probability: float = 0.0
    rng: random.Random | None = None
    action: str = "kill"


_crash = _CrashPlan()


def arm(spec: str | None, *, action: str = "kill") -> None:
    """Arm a crash point: ``name[:n]`` or ``random:p[:seed]``; empty disarms."""
    global _crash
    if not spec:
        _crash = _CrashPlan()
        return
    parts = spec.split(":")
    if parts[0] == "random":
        seed = int(parts[2]) if len(parts) > 2 else None
        _crash = _CrashPlan(
            name="random",
            probability=float(parts[1]) if len(parts) > 1 else 0.05,
            rng=random.Random(seed),
            action=action,
        )
    else:
        _crash = _CrashPlan(
            name=parts[0], count=int(parts[1]) if len(parts) > 1 else 1, action=action
        )


def disarm() -> None:
    arm(None)


def add_option(parser) -> None:
    """The ``--crashpoint`` option of a command that runs steps (default: the env)."""
    parser.add_argument(
        "--crashpoint",
        default=os.environ.get(ENV, ""),
        help=f"tests only: die at this boundary ({', '.join(BOUNDARIES)})[:n]"
        f" or random:p[:seed]; default ${ENV}",
    )


def crashpoint(name: str) -> None:
    """Die here if a crash point is armed for this boundary (tests and demo only)."""
    plan = _crash
    if not plan.name:
        return
    if plan.name == "random":
        if plan.rng.random() >= plan.probability:
            return
    elif plan.name != name:
        return
    else:
        plan.count -= 1
        if plan.count > 0:
            return
    if plan.action == "raise":
        plan.name = ""
        raise SimulatedCrash(name)
    os.kill(os.getpid(), signal.SIGKILL)
