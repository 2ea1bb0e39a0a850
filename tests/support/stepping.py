"""Step a task in this process the way a worker's loop does."""

from __future__ import annotations

from tasks.executor import step
from tasks.models import Task


def run_steps(task: Task, worker_id: str, times: int = 10) -> Task:
    """Step ``task`` until the executor has nothing for ``worker_id`` (at most
    ``times`` steps); return the task as it is then.

    Unlike ``tests.support.executing.run_task`` this does not stop when the
    task leaves "running": it keeps asking, as a worker's loop would.
    """
    for _ in range(times):
        if step(task_id=task.pk, worker_id=worker_id) is None:
            break
    task.refresh_from_db()
    return task
