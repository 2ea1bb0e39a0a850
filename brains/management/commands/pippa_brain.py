"""Run a brain against a task: ``manage.py pippa_brain <task_id> --brain codex ...``.

The command is only the loop's host; the work is ``brains.runner``. By
default it runs in-process as the task's owner; with ``--api-url`` it talks to
a Pippa server over the JSON API with a token from ``--token-env``, exactly
like a runner on another machine.

``--local`` needs no key: it starts llama.cpp's OpenAI-compatible server with
the small model of the ``local`` extra (``brains.local``) on a free port of
127.0.0.1, drives the task with it as the "ollama" brain, and stops the
server afterwards; each turn is fitted into the server's context
(``--local-context``, ``brains.runner.Room.for_context``), as
``--context-tokens`` fits it for any other brain. ``--demo-task`` makes a
fresh demo task for ``--user`` (default "dad", made by ``pippa_demo``)
instead of naming one: three steps, or ``--demo-steps N``.
"""

from __future__ import annotations

import argparse
import contextlib
import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.template.defaultfilters import pluralize

from brains import DEFAULT_KIND, KINDS, BrainError, brain_make
from brains.base import RETRIES, TIMEOUT
from brains.local import CONTEXT_TOKENS as LOCAL_CONTEXT
from brains.local import (
    ERR_DEMO_STEPS,
    MIN_DEMO_STEPS,
    MODEL_NAME,
    LocalBrainUnavailable,
)
from brains.local import TURN_TIMEOUT as LOCAL_TIMEOUT
from brains.runner import HttpBackend, LocalBackend, Room, ToolFailure, run_brain
from tasks.models import Brain, Task

ERR_NO_TASK = "no task {id}"
ERR_NO_KEY = "the environment variable {var} (the API key) is not set"
ERR_NO_TOKEN = "--api-url needs a token in the environment variable {var}"
ERR_TASK_OR_DEMO = "name a task id, or ask for a fresh one with --demo-task"
ERR_NO_USER = "no user {name!r}: run `manage.py pippa_demo` first, or pass --user"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number above 0, not {text!r}"
        )
    return value


class Command(BaseCommand):
    help = "Drive one task with one brain (OpenAI-compatible, Anthropic, Gemini or scripted)."

    def add_arguments(self, parser):
        parser.add_argument("task_id", type=int, nargs="?")
        parser.add_argument(
            "--brain",
            choices=Brain.values,
            help="the brain recorded on the task (default: scripted; ollama with --local)",
        )
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
        parser.add_argument(
            "--timeout",
            type=float,
            default=None,
            help=f"seconds one answer may take (default {TIMEOUT:g}; "
            f"{LOCAL_TIMEOUT:g} with --local)",
        )
        parser.add_argument("--retries", type=int, default=RETRIES)
        parser.add_argument(
            "--max-tokens",
            type=positive_int,
            default=None,
            help="the most tokens one answer may take (default: the vendor's)",
        )
        parser.add_argument("--max-turns", type=int, default=60)
        parser.add_argument(
            "--context-tokens",
            type=positive_int,
            default=None,
            help="the brain's context in tokens: each turn's request is fitted "
            "into it, leaving a quarter for the answer (default: no bound; "
            "--local-context with --local)",
        )
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
        parser.add_argument(
            "--local",
            action="store_true",
            help="start llama.cpp's server with the small model of the 'local' "
            "extra and drive the task with it (no key needed)",
        )
        parser.add_argument(
            "--local-model", default=None, help="another GGUF file for --local"
        )
        parser.add_argument(
            "--local-context",
            type=positive_int,
            default=LOCAL_CONTEXT,
            help=f"the --local server's context in tokens (default {LOCAL_CONTEXT}); "
            "it also bounds one answer, as its tool calls ignore --max-tokens",
        )
        parser.add_argument(
            "--demo-task",
            action="store_true",
            help="make a fresh demo task for --user and drive it",
        )
        parser.add_argument(
            "--demo-steps",
            type=positive_int,
            default=MIN_DEMO_STEPS,
            help=f"how many steps --demo-task makes (default {MIN_DEMO_STEPS}: "
            "the closes, a search, the chart; each step more is a search)",
        )
        parser.add_argument("--user", default="dad", help="owner of --demo-task")

    def handle(self, *args, **opts):
        if opts["demo_steps"] < MIN_DEMO_STEPS:
            raise CommandError(
                ERR_DEMO_STEPS.format(least=MIN_DEMO_STEPS, count=opts["demo_steps"])
            )
        if opts["demo_task"]:
            opts["task_id"] = self.demo_task(opts["user"], opts["demo_steps"]).pk
        elif opts["task_id"] is None:
            raise CommandError(ERR_TASK_OR_DEMO)
        with contextlib.ExitStack() as stack:
            if opts["local"]:
                server = self.local_server(opts)
                try:
                    stack.enter_context(server)
                except LocalBrainUnavailable as exc:
                    raise CommandError(str(exc)) from None
                opts["base_url"] = server.base_url
                opts["brain"] = opts["brain"] or "ollama"
                opts["kind"] = opts["kind"] or "openai"
                opts["model"] = opts["model"] or MODEL_NAME
                opts["timeout"] = opts["timeout"] or LOCAL_TIMEOUT
                opts["context_tokens"] = opts["context_tokens"] or opts["local_context"]
            self.drive(opts)

    def demo_task(self, username: str, count: int):
        """Make a fresh demo task of ``count`` steps in the user's local-brain conversation."""
        from brains.local import DEMO_CONVERSATION, DEMO_TITLE, demo_steps
        from tasks.models import Conversation
        from tasks.plan import conversation_task_create, task_create

        owner = get_user_model().objects.filter(username=username).first()
        if owner is None:
            raise CommandError(ERR_NO_USER.format(name=username))
        conversation = (
            Conversation.objects.filter(owner=owner, title=DEMO_CONVERSATION)
            .order_by("pk")
            .first()
        )
        steps = demo_steps(count)
        if conversation is None:
            task = conversation_task_create(
                owner=owner,
                conversation_title=DEMO_CONVERSATION,
                title=DEMO_TITLE,
                steps=steps,
            )
        else:
            task = task_create(conversation=conversation, title=DEMO_TITLE, steps=steps)
        self.stdout.write(
            f"Made task {task.pk}: {task.title} ({len(steps)} steps), "
            f"in the conversation {DEMO_CONVERSATION!r} of {username}"
        )
        return task

    def local_server(self, opts):
        """Return the local server, not started: the caller's ``with`` starts it."""
        from brains.local import LocalBrainUnavailable, LocalModelServer

        try:
            server = LocalModelServer(
                model=opts["local_model"], context_tokens=opts["local_context"]
            )
        except LocalBrainUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Starting llama.cpp's server with {server.model.name} "
            f"on 127.0.0.1:{server.port} (log: {server.log_path})"
        )
        return server

    def drive(self, opts) -> None:
        from django.conf import settings

        brain_name = opts["brain"] or "scripted"
        kind = opts["kind"] or DEFAULT_KIND.get(brain_name, "openai")
        api_key = ""
        if opts["api_key_env"]:
            api_key = os.environ.get(opts["api_key_env"], "")
            if not api_key:
                raise CommandError(ERR_NO_KEY.format(var=opts["api_key_env"]))
        brain = brain_make(
            kind=kind,
            brain=brain_name,
            model=opts["model"],
            base_url=opts["base_url"],
            api_key=api_key,
            timeout=opts["timeout"] or TIMEOUT,
            retries=opts["retries"],
            max_tokens=opts["max_tokens"],
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
                room=Room.for_context(opts["context_tokens"])
                if opts["context_tokens"]
                else None,
                on_event=lambda line: self.stdout.write(line),
            )
        except (BrainError, ToolFailure) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{report.brain}: {report.turns} turn{pluralize(report.turns)}, "
            f"{report.steps_run} step{pluralize(report.steps_run)} run, "
            f"{report.refused} call{pluralize(report.refused)} answered with an error, "
            f"{report.total_tokens:,} tokens; task {report.task_id} is "
            f"{report.task_status} ({report.stopped_because})"
        )
        if report.final_text:
            self.stdout.write(report.final_text)
