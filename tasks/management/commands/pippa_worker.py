"""``python manage.py pippa_worker``: step runnable tasks until stopped.

The command is only the loop; each step is ``tasks.executor.step``. SIGTERM
(or Ctrl-C) lets the current step finish, releases the lease and exits; a
second signal abandons the step at once (its envelope stays open for the next
worker to resolve by class) and still releases the lease.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

from django.core.management import BaseCommand
from django.db import close_old_connections, connection

from tasks.executor import LeaseLost, lease_release, step
from tasks.models import Task
from tasks.tools import tools_load

log = logging.getLogger("pippa.worker")


class WorkerAbandoned(BaseException):
    """A second stop signal: leave the current step where it is."""


class Command(BaseCommand):
    help = "Step runnable tasks until stopped (SIGTERM finishes the current step)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="exit when nothing is runnable instead of waiting for work",
        )
        parser.add_argument("--worker-id", default="", help="name in leases and events")
        parser.add_argument(
            "--poll", type=float, default=1.0, help="seconds between idle polls"
        )
        parser.add_argument(
            "--max-steps", type=int, default=0, help="stop after this many steps"
        )
        parser.add_argument(
            "--task", type=int, action="append", default=[], help="only these task ids"
        )

    def handle(self, *args, **options) -> None:
        tools_load()
        worker_id = (
            options["worker_id"] or f"worker:{socket.gethostname()}-{os.getpid()}"
        )
        state = {"stop": False, "signals": 0}

        def on_signal(signum, frame) -> None:
            state["signals"] += 1
            state["stop"] = True
            if state["signals"] > 1:
                raise WorkerAbandoned()

        previous = {
            sig: signal.signal(sig, on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        verbose = options["verbosity"] >= 1
        if verbose:
            self.stdout.write(f"{worker_id}: stepping runnable tasks")
        steps = 0
        current: int | None = None
        try:
            while not state["stop"]:
                if not connection.in_atomic_block:
                    close_old_connections()
                runnable = Task.objects.runnable()
                if options["task"]:
                    runnable = runnable.filter(pk__in=options["task"])
                ids = list(
                    runnable.order_by("updated_at", "id").values_list("id", flat=True)[
                        :20
                    ]
                )
                if not ids:
                    if options["until_idle"]:
                        break
                    self._sleep(options["poll"], state)
                    continue
                for task_id in ids:
                    if state["stop"]:
                        break
                    current = task_id
                    while not state["stop"]:
                        try:
                            outcome = step(task_id=task_id, worker_id=worker_id)
                        except LeaseLost as exc:
                            log.warning("%s: %s", worker_id, exc)
                            break
                        if outcome is None:
                            break
                        steps += 1
                        if verbose and outcome.position is not None:
                            self.stdout.write(
                                f"task {task_id} step {outcome.position}: "
                                f"{outcome.status}"
                                + (f" ({outcome.rule})" if outcome.rule else "")
                                + f"; task {outcome.task_status}"
                            )
                        if options["max_steps"] and steps >= options["max_steps"]:
                            state["stop"] = True
                        if outcome.task_status != Task.Status.RUNNING:
                            break
                    self._release(task_id, worker_id)
                    current = None
        except WorkerAbandoned:
            if verbose:
                self.stdout.write(f"{worker_id}: abandoning the current step")
        finally:
            if current is not None:
                self._release(current, worker_id)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if verbose:
            self.stdout.write(f"{worker_id}: stopped after {steps} step(s)")

    @staticmethod
    def _release(task_id: int, worker_id: str) -> None:
        task = Task.objects.filter(pk=task_id, lease_owner=worker_id).first()
        if task is not None:
            lease_release(task=task, actor=worker_id)

    @staticmethod
    def _sleep(seconds: float, state: dict) -> None:
        deadline = time.monotonic() + seconds
        while not state["stop"] and time.monotonic() < deadline:
            time.sleep(min(0.1, seconds))
