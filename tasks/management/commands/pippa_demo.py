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
    LIVE_CONVERSATION,
    four_steps,
    live_task_running,
    live_task_start,
)
from tasks.executor import step
from tasks.models import Conversation, Step, Task
from tasks.plan import task_create
from tasks.tools import tools_load

DEMO_USER = "dad"
DEFAULT_PASSWORD = "dad-demo-password"
LOADER = "worker:demo-loader"


# (task title, crash point "<boundary>:<n-th step>", plan)
INTERRUPTED = [
    (
        "Stopped before the search was logged as started",
        "before_started_commit:3",
        None,
    ),
    ("Stopped after the search started, before it ran", "after_started:3", None),
    (
        "Stopped after the title card was drawn, before it was saved",
        "after_tool:1",
        None,
    ),
    (
        "Stopped after the search snapshot was written, before it was recorded",
        "after_blob:3",
        None,
    ),
    (
        "Stopped after the chart was written, before it was recorded",
        "after_blob:4",
        None,
    ),
    ("Stopped right after the closes were recorded", "after_result:2", None),
    (
        "Stopped after a note to Dad was sent",
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
            ("PIPA: a finished chart", self.finished),
            ("PIPA: interrupted at each boundary", self.interrupted),
            ("PIPA: a retried search", self.retried),
            ("PIPA: a branched task", self.branched),
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
            title="Chart PIPA's first half",
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
            conversation=conversation, title="Chart PIPA despite an outage", steps=steps
        )
        run_until_stopped(task)
        failed = Step.objects.get(task=task, position=3)
        step_retry(step=failed, actor="demo")
        run_until_stopped(task)

    def branched(self, conversation: Conversation) -> None:
        task = task_create(
            conversation=conversation, title="Chart PIPA, take one", steps=four_steps()
        )
        run_until_stopped(task)
        branch = task_branch(task=task, after_position=2, actor="demo")
        run_until_stopped(branch)

    def live(self, conversation: Conversation) -> None:
        live_task_start(conversation=conversation)
