"""``python manage.py pippa_demo``: load the demo for Dad (a second run changes nothing).

Creates the non-staff user "dad" and conversations that show the executor:
a finished four-class task, a task interrupted at each envelope boundary
(paused, so "what will resume do" stays on screen until Dad resumes it), a
retried step, a branched task, and a queued task with slow steps that the
worker started by ``make run`` advances live.
"""

from __future__ import annotations

import importlib
import os
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management import BaseCommand
from django.utils import timezone

from tasks import crashpoints
from tasks.actions import step_retry, task_branch, task_pause
from tasks.crashpoints import SimulatedCrash
from tasks.demo import (
    DEMO_USER,
    LIVE_CONVERSATION,
    four_steps,
    live_task_running,
    live_task_start,
)
from tasks.executor import step
from tasks.models import Conversation, Step, Task
from tasks.plan import task_create
from tasks.tools import tools_load

DEFAULT_PASSWORD = "dad-demo-password"
# The demo's conversations, in Dad's words (the ticker PIPA is Pippa Paper).
DEMO_FINISHED = "Pippa Paper's shares: a finished chart"
DEMO_INTERRUPTED = "Pippa Paper's shares: when the computer stopped midway"
DEMO_RETRIED = "Pippa Paper's shares: a search that failed at first"
DEMO_BRANCHED = "Pippa Paper's shares: changing course"
LOADER = "worker:demo-loader"


# (task title, crash point "<boundary>:<n-th step>", plan)
INTERRUPTED = [
    (
        "The computer stopped just before the news search",
        "before_started_commit:3",
        None,
    ),
    ("The computer stopped as the news search began", "after_started:3", None),
    (
        "The computer stopped while saving the title card",
        "after_tool:1",
        None,
    ),
    (
        "The computer stopped while filing the news it found",
        "after_blob:3",
        None,
    ),
    (
        "The computer stopped while filing the chart",
        "after_blob:4",
        None,
    ),
    ("The computer stopped right after saving the prices", "after_result:2", None),
    (
        "The computer stopped just after sending Dad a note",
        "after_tool:1",
        [
            {
                "title": "Send Dad a note",
                "tool": "demo.notify",
                "args": {"to": "dad", "message": "The PIPA chart is ready."},
            }
        ],
    ),
]


def run_until_stopped(task: Task) -> None:
    for _ in range(50):
        outcome = step(task_id=task.pk, worker_id=LOADER)
        if outcome is not None and outcome.next_attempt_at is not None:
            # The demo compresses time: the back-off before a retry is over.
            Step.objects.filter(pk=outcome.step_id).update(next_attempt_at=None)
            continue
        if outcome is None or outcome.task_status != Task.Status.RUNNING:
            return


def interrupt(task: Task, point: str) -> None:
    """Leave ``task`` as a worker killed at ``point`` would, then pause it."""
    crashpoints.arm(point, action="raise")
    try:
        run_until_stopped(task)
    except SimulatedCrash:
        pass
    finally:
        crashpoints.disarm()
    Task.objects.filter(pk=task.pk, lease_owner=LOADER).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    task.refresh_from_db()
    task_pause(task=task, actor="demo")


class Command(BaseCommand):
    help = "Create the demo user 'dad' and demo conversations (idempotent)."

    def handle(self, *args, **options) -> None:
        tools_load()
        User = get_user_model()
        password = os.environ.get("PIPPA_DEMO_PASSWORD") or DEFAULT_PASSWORD
        dad, created = User.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": False}
        )
        if created:
            dad.set_password(password)
            dad.save(update_fields=["password"])
        verbose = options["verbosity"] >= 1
        if verbose:
            self.stdout.write(
                f"Demo user: {DEMO_USER} / {password}"
                + ("" if created else " (set when the user was first created)")
            )
        made = []
        for title, build in [
            (DEMO_FINISHED, self.finished),
            (DEMO_INTERRUPTED, self.interrupted),
            (DEMO_RETRIED, self.retried),
            (DEMO_BRANCHED, self.branched),
            (LIVE_CONVERSATION, self.live),
        ]:
            existing = Conversation.objects.filter(owner=dad, title=title).first()
            if existing is not None:
                if title == LIVE_CONVERSATION and not live_task_running(existing):
                    # The last live task finished: start a fresh one to watch.
                    live_task_start(conversation=existing)
                    made.append(f"{title} (a fresh live task)")
                continue
            conversation = Conversation.objects.create(owner=dad, title=title)
            build(conversation)
            made.append(title)
        try:
            council_demo = importlib.import_module("council.demo")
        except ImportError:
            council_demo = None
        if council_demo is not None and hasattr(council_demo, "demo_round_load"):
            council_demo.demo_round_load(owner=dad)
        if verbose:
            if made:
                for title in made:
                    self.stdout.write(f"  created: {title}")
            else:
                self.stdout.write("  demo already loaded; nothing to do")

    def finished(self, conversation: Conversation) -> None:
        task = task_create(
            conversation=conversation,
            title="Chart Pippa Paper's first half of 2024",
            steps=four_steps(),
        )
        run_until_stopped(task)

    def interrupted(self, conversation: Conversation) -> None:
        for title, point, plan in INTERRUPTED:
            task = task_create(
                conversation=conversation, title=title, steps=plan or four_steps()
            )
            interrupt(task, point)

    def retried(self, conversation: Conversation) -> None:
        steps = four_steps()
        steps[2] = {
            **steps[2],
            "title": "Search the news (the service was down at first)",
            "args": {**steps[2]["args"], "fail_until_generation": 1},
            "max_attempts": 2,
        }
        task = task_create(
            conversation=conversation,
            title="Chart Pippa Paper's shares while the news service was down",
            steps=steps,
        )
        run_until_stopped(task)
        failed = Step.objects.get(task=task, position=3)
        step_retry(step=failed, actor="demo")
        run_until_stopped(task)

    def branched(self, conversation: Conversation) -> None:
        task = task_create(
            conversation=conversation,
            title="Chart Pippa Paper's shares, first try",
            steps=four_steps(),
        )
        run_until_stopped(task)
        branch = task_branch(task=task, after_position=2, actor="demo")
        run_until_stopped(branch)

    def live(self, conversation: Conversation) -> None:
        live_task_start(conversation=conversation)
