"""Run a brain against a task: ``manage.py pippa_brain <task_id> --brain codex ...``.

The command is only the loop's host; the work is ``brains.runner``. By
default it runs in-process as the task's owner; with ``--api-url`` it talks to
a Pippa server over the JSON API with a token from ``--token-env``, exactly
like a runner on another machine.
"""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from brains import DEFAULT_KIND, KINDS, BrainError, brain_make
from brains.base import RETRIES, TIMEOUT
from brains.runner import HttpBackend, LocalBackend, ToolFailure, run_brain
from tasks.models import Brain, Task

ERR_NO_TASK = "no task {id}"
ERR_NO_KEY = "the environment variable {var} (the API key) is not set"
ERR_NO_TOKEN = "--api-url needs a token in the environment variable {var}"


class Command(BaseCommand):
    help = "Drive one task with one brain (OpenAI-compatible, Anthropic, Gemini or scripted)."

    def add_arguments(self, parser):
        parser.add_argument("task_id", type=int)
        parser.add_argument("--brain", default="scripted", choices=Brain.values)
        parser.add_argument(
            "--kind",
            choices=KINDS,
            help="wire format (default: the brain's own, e.g. codex -> openai)",
        )
        parser.add_argument("--model", default="")
        parser.add_argument("--base-url", default=None, help="the vendor endpoint")
        parser.add_argument(
            "--api-key-env", default="", help="environment variable holding the API key"
        )
        parser.add_argument("--timeout", type=float, default=TIMEOUT)
        parser.add_argument("--retries", type=int, default=RETRIES)
        parser.add_argument("--max-turns", type=int, default=60)
        parser.add_argument(
            "--lease-wait",
            type=float,
            default=None,
            help="seconds to wait for another worker's lease (default: one lease period)",
        )
        parser.add_argument("--worker", default=None, help="lease name of this runner")
        parser.add_argument(
            "--api-url", default="", help="run over the JSON API at this URL"
        )
        parser.add_argument("--token-env", default="PIPPA_API_TOKEN")

    def handle(self, *args, **opts):
        from django.conf import settings

        kind = opts["kind"] or DEFAULT_KIND.get(opts["brain"], "openai")
        api_key = ""
        if opts["api_key_env"]:
            api_key = os.environ.get(opts["api_key_env"], "")
            if not api_key:
                raise CommandError(ERR_NO_KEY.format(var=opts["api_key_env"]))
        brain = brain_make(
            kind=kind,
            brain=opts["brain"],
            model=opts["model"],
            base_url=opts["base_url"],
            api_key=api_key,
            timeout=opts["timeout"],
            retries=opts["retries"],
        )
        if opts["api_url"]:
            token = os.environ.get(opts["token_env"], "")
            if not token:
                raise CommandError(ERR_NO_TOKEN.format(var=opts["token_env"]))
            backend = HttpBackend(base_url=opts["api_url"], token=token)
        else:
            task = (
                Task.objects.select_related("conversation__owner")
                .filter(pk=opts["task_id"])
                .first()
            )
            if task is None:
                raise CommandError(ERR_NO_TASK.format(id=opts["task_id"]))
            backend = LocalBackend(user=task.conversation.owner)
        lease_wait = opts["lease_wait"]
        if lease_wait is None:
            lease_wait = settings.PIPPA_LEASE_SECONDS + 5
        try:
            report = run_brain(
                brain=brain,
                backend=backend,
                task_id=opts["task_id"],
                worker=opts["worker"],
                max_turns=opts["max_turns"],
                lease_wait=lease_wait,
                on_event=lambda line: self.stdout.write(line),
            )
        except (BrainError, ToolFailure) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{report.brain}: {report.turns} turns, {report.steps_run} steps run; "
            f"task {report.task_id} is {report.task_status} "
            f"({report.stopped_because})"
        )
        if report.final_text:
            self.stdout.write(report.final_text)
