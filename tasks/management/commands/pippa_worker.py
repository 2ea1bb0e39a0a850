"""``python manage.py pippa_worker``: step runnable tasks until stopped.

The command is only the loop; each step is ``tasks.executor.step``. SIGTERM
(or Ctrl-C) lets the current step finish, releases the lease and exits; a
second signal abandons the step at once (its envelope stays open for the next
worker to resolve by class) and still releases the lease.

The worker outlives its store's bad moments. A database error (disk full,
"database is locked" past the busy timeout, PostgreSQL restarting, a cut
connection) or a step whose output could not be saved puts it in a fault
state: it logs one line naming the reason, drops its connection, backs off
(``tasks.faults.fault_delay``: exponential, capped, jittered), probes the
store (``tasks.faults.store_probe``) and carries on once it takes writes.

Each round first sends ``tasks.hooks.worker_round``, on which the
notifications app delivers what is due (``notifications.outbox.notify_deliver``):
steps that started waiting for a person are told to their owners after the
commit that made them wait; a receiver that fails is tried again after a
back-off, on a later round.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

from django.conf import settings
from django.core.management import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections, connection

from artifacts.gc import pending_unlinks_finish
from pippa_site import metrics
from tasks import crashpoints, hooks
from tasks.executor import StepOutcome, step, unnamed_blobs_record
from tasks.faults import fault_delay, fault_reason, store_probe, worker_waits
from tasks.lease import LeaseLost, lease_release
from tasks.models import Task
from tasks.tools import tools_load

log = logging.getLogger("pippa.worker")

RELEASE_TRIES = 3
ERR_METRICS_TOKEN = (
    "--metrics-port needs PIPPA_METRICS_TOKEN: the scraper's token, "
    "so the figures are not open to anyone who can reach the port"
)


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
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=int(os.environ.get("PIPPA_WORKER_METRICS_PORT") or 0),
            help="serve this host's counters at /metrics on this port, to a "
            "scraper with PIPPA_METRICS_TOKEN (a host with no web process)",
        )
        parser.add_argument(
            "--metrics-address",
            default="127.0.0.1",
            help="address the metrics port listens on",
        )
        crashpoints.add_option(parser)

    def handle(self, *args, **options) -> None:
        if options["metrics_port"]:
            if not settings.PIPPA_METRICS_TOKEN:
                raise CommandError(ERR_METRICS_TOKEN)
            metrics.serve(
                address=options["metrics_address"],
                port=options["metrics_port"],
                token=settings.PIPPA_METRICS_TOKEN,
            )
        tools_load()
        crashpoints.arm(options["crashpoint"])
        self.worker_id = (
            options["worker_id"] or f"worker:{socket.gethostname()}-{os.getpid()}"
        )
        self.options = options
        self.state = {"stop": False, "signals": 0}
        self.verbose = options["verbosity"] >= 1
        self.steps = 0
        # Consecutive faults, the reason of the last one and the size of the
        # write that failed (the probe wants that much room).
        self.faults, self.reason, self.needed = 0, "", 0

        def on_signal(signum, frame) -> None:
            self.state["stop"] = True
            self.state["signals"] += 1
            if self.state["signals"] > 1:
                raise WorkerAbandoned()

        previous = {
            sig: signal.signal(sig, on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        self._finish_pending_unlinks()
        for problem in hooks.worker_problems(worker_id=self.worker_id):
            log.warning("%s: %s", self.worker_id, problem)
        if self.verbose:
            self.stdout.write(f"{self.worker_id}: stepping runnable tasks")
        self.current: int | None = None
        try:
            while not self.state["stop"]:
                if self.faults and not self._wait_for_store():
                    continue
                try:
                    if not self._round():
                        break
                except LeaseLost as exc:
                    log.warning("%s: %s", self.worker_id, exc)
                except DatabaseError as exc:
                    self._fault(fault_reason(exc), task_id=self.current)
        except WorkerAbandoned:
            if self.verbose:
                self.stdout.write(f"{self.worker_id}: abandoning the current step")
        finally:
            if self.current is not None:
                self._release(self.current)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.verbose:
            self.stdout.write(f"{self.worker_id}: stopped after {self.steps} step(s)")

    # -- one round: poll, then step each runnable task until it stops -------

    def _round(self) -> bool:
        """Poll once and step what is runnable; False when --until-idle is done."""
        if not connection.in_atomic_block:
            close_old_connections()
        if self.current is not None and self._release(self.current):
            self.current = None  # a lease a fault kept us from giving back
        hooks.worker_round.send(sender=None, worker_id=self.worker_id)
        runnable = Task.objects.runnable()
        if self.options["task"]:
            runnable = runnable.filter(pk__in=self.options["task"])
        ids = list(
            runnable.order_by("updated_at", "id").values_list("id", flat=True)[:20]
        )
        if not ids:
            if self.options["until_idle"]:
                return False
            self._sleep(self.options["poll"])
            return True
        for task_id in ids:
            if self.state["stop"]:
                break
            self.current = task_id
            outcome = self._step_task(task_id)
            if self._release(task_id):
                self.current = None
            if outcome is not None and worker_waits(outcome.fault):
                self.needed = outcome.fault_bytes
                self._fault(outcome.fault, task_id=task_id)
                break
        return True

    def _step_task(self, task_id: int) -> StepOutcome | None:
        """Step one task while it stays ours and running; return a faulted outcome."""
        while not self.state["stop"]:
            try:
                outcome = step(task_id=task_id, worker_id=self.worker_id)
            except LeaseLost as exc:
                log.warning("%s: %s", self.worker_id, exc)
                return None
            if outcome is None:
                return None
            self.steps += 1
            if self.verbose and outcome.position is not None:
                self.stdout.write(_describe(outcome))
            if worker_waits(outcome.fault):
                return outcome
            if self.options["max_steps"] and self.steps >= self.options["max_steps"]:
                self.state["stop"] = True
            if outcome.task_status != Task.Status.RUNNING:
                return None
        return None

    # -- faults ----------------------------------------------------------------

    def _fault(self, reason: str, *, task_id: int | None = None) -> None:
        """Enter (or stay in) the fault state: one line, drop the connection."""
        self.faults += 1
        self.reason = reason
        delay = fault_delay(self.faults)
        where = f" (task {task_id})" if task_id else ""
        log.warning(
            "%s: %s%s; backing off %.1f s, then checking the store again",
            self.worker_id,
            reason,
            where,
            delay,
        )
        self.delay = delay
        if not connection.in_atomic_block:
            connection.close()

    def _wait_for_store(self) -> bool:
        """Sleep out the back-off and probe; True once the store takes writes."""
        self._sleep(self.delay)
        if self.state["stop"]:
            return False
        reason = store_probe(needed=self.needed)
        if reason:
            self.faults += 1
            self.delay = fault_delay(self.faults)
            log.info(
                "%s: still waiting: %s; next check in %.1f s",
                self.worker_id,
                reason,
                self.delay,
            )
            return False
        try:
            unnamed_blobs_record()
        except DatabaseError as exc:
            self._fault(fault_reason(exc))
            return False
        log.warning(
            "%s: the store takes writes again (after: %s); carrying on",
            self.worker_id,
            self.reason,
        )
        self.faults, self.reason, self.needed = 0, "", 0
        if self.current is not None and self._release(self.current):
            # A step cut short by the database: its task is given back so the
            # next poll (this worker's or another's) resumes it by class.
            self.current = None
        return True

    def _release(self, task_id: int) -> bool:
        """Give the lease back (True when done); a refusing database is tried again."""
        for attempt in range(1, RELEASE_TRIES + 1):
            try:
                task = Task.objects.filter(
                    pk=task_id, lease_owner=self.worker_id
                ).first()
                if task is not None:
                    lease_release(task=task, actor=self.worker_id)
                return True
            except DatabaseError as exc:
                if not connection.in_atomic_block:
                    connection.close()
                if attempt == RELEASE_TRIES:
                    log.warning(
                        "%s: could not release the lease of task %s (%s); "
                        "it expires on its own",
                        self.worker_id,
                        task_id,
                        fault_reason(exc),
                    )
                    return False
                time.sleep(fault_delay(attempt))
        return False

    def _finish_pending_unlinks(self) -> None:
        """Finish the blob unlinks a killed delete left (at start, no grace period)."""
        try:
            removed = pending_unlinks_finish()
        except DatabaseError as exc:
            log.warning(
                "%s: pending blob unlinks wait for the next start or delete: %s",
                self.worker_id,
                fault_reason(exc),
            )
            return
        if removed:
            log.info("%s: unlinked %s blob(s) a delete left", self.worker_id, removed)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.state["stop"] and time.monotonic() < deadline:
            time.sleep(min(0.1, max(seconds, 0.01)))


def _describe(outcome: StepOutcome) -> str:
    """One line per step, naming the reason when it did not finish."""
    line = f"task {outcome.task_id} step {outcome.position}: {outcome.status}"
    if outcome.rule:
        line += f" ({outcome.rule})"
    if outcome.error and outcome.status != "done":
        line += f": {outcome.error[:300]}"
    return line + f"; task {outcome.task_status}"
