"""``manage.py pippa_worker`` as the slow tests start it, in a child process.

One spelling of the command line and of the environment that loads the test
tools (``tests.support.tools``) and logs their calls to a file the test reads
(``tests.support.executing.invocations``); each test adds what it is about (a
crash point, a lease, a fault's back-off, a mail server) to that environment.
"""

from __future__ import annotations

import sys
from pathlib import Path


def worker_argv(
    *task_ids: int,
    worker_id: str | None = None,
    until_idle: bool = True,
    quiet: bool = True,
    poll: float | None = None,
) -> list[str]:
    """The command line of a worker (run from the repository's folder).

    ``until_idle``: exit once nothing is left to run; ``task_ids``: only
    these tasks; ``quiet``: ``-v 0``.
    """
    argv = [sys.executable, "manage.py", "pippa_worker"]
    if until_idle:
        argv.append("--until-idle")
    if worker_id is not None:
        argv += ["--worker-id", worker_id]
    if poll is not None:
        argv += ["--poll", str(poll)]
    for task_id in task_ids:
        argv += ["--task", str(task_id)]
    if quiet:
        argv += ["-v", "0"]
    return argv


def tools_env(
    subprocess_env: dict[str, str],
    log: Path | None = None,
    *,
    crashpoint: str = "",
    **extra: str,
) -> dict[str, str]:
    """``subprocess_env`` with the test tools loaded and, given ``log``, their
    calls logged there; given ``crashpoint``, the worker dies there
    (``tasks.crashpoints``); ``extra`` variables on top."""
    env = {**subprocess_env, "PIPPA_TOOLS": "tests.support.tools"}
    if log is not None:
        env["PIPPA_TOOL_LOG"] = str(log)
    if crashpoint:
        env["PIPPA_CRASHPOINT"] = crashpoint
    return {**env, **extra}
