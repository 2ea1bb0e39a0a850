"""Drive one task with one brain: the brain decides, the executor does.

The runner tells the brain the plan and the resume context, offers it a few
tools, and carries out each tool call through Pippa's durable state:

- ``run_next_step``: the executor runs the next unfinished step; the result
  is handed to the brain only after it is persisted;
- ``rewrite_plan``: replace the not-yet-run part of the plan;
- ``read_artifact``: read an artifact by ref (metadata and a text excerpt);
- ``read_resume_context``: the task's current state, as a resumed brain sees it.

Two backends carry the calls: ``LocalBackend`` (in-process services, for the
``pippa_brain`` command) and ``HttpBackend`` (the JSON API with a bearer
token, for a runner on another machine). Both give the brain the same
documents.

Real models send malformed calls: arguments that are not JSON (a small model
often cuts them short), a tool that does not exist, a value of the wrong
type, an empty plan. Each is answered as that call's result with
``{"error": "<a plain sentence>"}``, so the brain can correct itself; the
turn counts against ``max_turns`` like any other, and the run goes on.

Each answer of the brain is recorded on the task as a ``brain_turn`` event
(``tasks.usage``): how many calls it asked for, how many were malformed, and
the vendor's token counts, which the dashboard, the API and MCP sum per task.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from brains.base import BrainAdapter, BrainReply, Message, ToolSpec, json_kind
from pippa_site.errors import LeaseConflict, PippaError

logger = logging.getLogger("pippa.brains")

MAX_EXCERPT_BYTES = 4096
MAX_CONTEXT_CHARS = 24_000
TEXT_TYPES = ("text/", "application/json", "image/svg+xml", "application/xml")

SYSTEM_PROMPT = """\
You drive a task whose plan and progress live in Pippa's durable state, not in \
this chat. The plan is an ordered list of steps; each step runs one tool and its \
output is stored as an artifact (a ref: id, sha256, class). Never redo finished \
work: the resume context below says which steps are done and what each unfinished \
step will do on resume.
Call run_next_step to run the next unfinished step; its result reaches you only \
after it is saved. Call it again until the task is done, failed or needs review. \
Use rewrite_plan to change steps that have not run yet (finished steps must stay \
as they are), read_artifact to read an output by its id, and read_resume_context \
to see the current state. When the task is settled, answer with a short summary \
and no tool call."""

TOOL_SPECS = [
    ToolSpec(
        name="run_next_step",
        description=(
            "Run the task's next unfinished step through the durable executor and "
            "return its saved result and the task's progress."
        ),
        parameters={"type": "object", "properties": {}},
    ),
    ToolSpec(
        name="rewrite_plan",
        description=(
            "Replace the plan. List every step in order; give an existing step's id "
            "to keep it. Finished steps must stay first and unchanged."
        ),
        parameters={
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "title": {"type": "string"},
                            "tool": {"type": "string"},
                            "args": {
                                "type": "object",
                                "description": "the tool's keyword arguments",
                                "additionalProperties": True,
                            },
                        },
                        "required": ["title", "tool"],
                    },
                }
            },
            "required": ["steps"],
        },
    ),
    ToolSpec(
        name="read_artifact",
        description=(
            "Read an artifact by id: its metadata, source refs and, for text, "
            "the first few KiB."
        ),
        parameters={
            "type": "object",
            "properties": {"artifact_id": {"type": "integer"}},
            "required": ["artifact_id"],
        },
    ),
    ToolSpec(
        name="read_resume_context",
        description="Return the task's current state as a resumed brain sees it.",
        parameters={"type": "object", "properties": {}},
    ),
]

# How each vendor says an answer stopped at its token bound (OpenAI, Ollama and
# llama.cpp; Anthropic; Gemini). A local server's bound is its context.
CUT_OFF = frozenset({"length", "max_tokens", "MAX_TOKENS"})
STOPPED_CUT_OFF = (
    "the answer was cut off at its token bound ({reason}) before a whole tool call; "
    "a larger --max-tokens (or --local-context) lets it finish"
)

ERR_UNKNOWN_TOOL = "unknown tool {name!r}; use one of: {names}"
ERR_BAD_ARGS = "bad arguments for {name}: {reason}"
ERR_STEPS_NOT_LIST = (
    "steps must be a list of steps (objects with title, tool and args), not {kind}"
)
ERR_ARTIFACT_ID = "artifact_id must be an integer (an artifact's id), not {value}"
ERR_SERVER = "Pippa answered HTTP {status} for {path}"
ERR_UNREACHABLE = "cannot reach Pippa at {url}: {reason}"
ERR_LEASE_WAIT = "the task's lease stayed with another worker for {seconds:g}s"


class ToolFailure(Exception):
    """A tool call the backend refused (4xx); the brain is told why."""


class LeaseBusy(ToolFailure):
    """Another worker holds the task's lease right now."""


class Backend(Protocol):
    def record_brain(self, task_id: int, brain: str) -> None: ...
    def record_turn(self, task_id: int, turn: dict[str, Any]) -> None: ...
    def resume_context(self, task_id: int) -> dict[str, Any]: ...
    def task(self, task_id: int) -> dict[str, Any]: ...
    def run_step(self, task_id: int, worker: str) -> dict[str, Any]: ...
    def rewrite_plan(self, task_id: int, steps: list[dict]) -> dict[str, Any]: ...
    def read_artifact(self, artifact_id: int) -> dict[str, Any]: ...
    def resume(self, task_id: int) -> dict[str, Any]: ...
    def release_lease(self, task_id: int, worker: str) -> None: ...


@dataclass
class RunReport:
    task_id: int
    brain: str
    turns: int = 0
    steps_run: int = 0
    tool_calls: list[str] = field(default_factory=list)
    # Calls answered with an error (malformed, unknown, refused by a service).
    refused: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    final_text: str = ""
    task_status: str = ""
    stopped_because: str = ""


def _compact(task: dict[str, Any]) -> dict[str, Any]:
    """The small view of a task a brain needs after each step."""
    return {
        "id": task.get("id"),
        "status": task.get("status"),
        "steps_done": task.get("steps_done"),
        "steps_total": task.get("steps_total"),
    }


def _excerpt(data: bytes, media_type: str) -> dict[str, Any]:
    if not media_type.startswith(TEXT_TYPES):
        return {"excerpt": None, "note": "binary payload; not shown"}
    text = data[:MAX_EXCERPT_BYTES].decode("utf-8", "replace")
    return {"excerpt": text, "truncated": len(data) > MAX_EXCERPT_BYTES}


def default_worker(brain: str) -> str:
    """A lease name unique to this process: two runners never share a lease."""
    return f"{brain}-{socket.gethostname()}-{os.getpid()}"[:80]


class Runner:
    """One brain, one task, one backend: the loop of the module docstring."""

    def __init__(
        self,
        *,
        brain: BrainAdapter,
        backend: Backend,
        task_id: int,
        worker: str | None = None,
        max_turns: int = 60,
        lease_wait: float = 0.0,
        poll: float = 0.25,
        on_event: Callable[[str], None] | None = None,
    ):
        self.brain = brain
        self.backend = backend
        self.task_id = task_id
        self.worker = worker or default_worker(brain.name)
        self.max_turns = max_turns
        self.lease_wait = lease_wait
        self.poll = poll
        self.on_event = on_event or (lambda line: logger.info("%s", line))
        self.report = RunReport(task_id=task_id, brain=brain.name)

    def opening(self) -> list[Message]:
        context = self.backend.resume_context(self.task_id)
        text = json.dumps(context, default=str, sort_keys=True)
        if len(text) > MAX_CONTEXT_CHARS:
            text = text[:MAX_CONTEXT_CHARS] + " …(truncated; call read_resume_context)"
        return [
            Message(
                role="user",
                text=(
                    f"Task {self.task_id}. Resume context (JSON, from durable state):\n"
                    f"{text}\nContinue the task from where it stands."
                ),
            )
        ]

    def run(self) -> RunReport:
        """Drive the task; always give the lease back when stopping.

        Starting a brain on a paused task is an explicit request to go on, so
        the task is queued again first (``tasks.actions.task_resume`` refuses
        while a step needs a person; the runner logs why and the brain then
        learns it from ``run_next_step``).
        """
        self.backend.record_brain(self.task_id, self.brain.name)
        if self.backend.task(self.task_id).get("status") == "paused":
            try:
                self.backend.resume(self.task_id)
            except ToolFailure as exc:
                self.on_event(f"{self.brain.name}: cannot resume: {exc}")
        try:
            return self._loop()
        finally:
            try:
                self.backend.release_lease(self.task_id, self.worker)
            except ToolFailure as exc:
                # The lease then simply expires; never hide the first error.
                self.on_event(f"{self.brain.name}: lease not released: {exc}")

    def _loop(self) -> RunReport:
        messages = self.opening()
        for _ in range(self.max_turns):
            reply = self.brain.complete(
                system=SYSTEM_PROMPT, messages=messages, tools=TOOL_SPECS
            )
            self.report.turns += 1
            self.record_turn(reply)
            # as_message() keeps what the vendor wants back (e.g. signatures).
            messages.append(reply.as_message())
            if reply.stop_reason in CUT_OFF and all(c.error for c in reply.tool_calls):
                # Nothing in it to run, and asking again would send a longer
                # prompt to a context that is full (a local server answers 400).
                self.report.final_text = reply.text
                self.report.stopped_because = STOPPED_CUT_OFF.format(
                    reason=reply.stop_reason
                )
                break
            if not reply.tool_calls:
                self.report.final_text = reply.text
                self.report.stopped_because = "the brain answered without a tool call"
                break
            for call in reply.tool_calls:
                if call.error:
                    result = {"error": call.error}
                    self.on_event(
                        f"{self.brain.name}: {call.name or '?'} -> {call.error}"
                    )
                else:
                    result = self.call_tool(call.name, call.arguments)
                if result.get("error"):
                    self.report.refused += 1
                self.report.tool_calls.append(call.name)
                messages.append(
                    Message(
                        role="tool",
                        tool_call_id=call.id,
                        tool_name=call.name,
                        result=result,
                    )
                )
        else:
            self.report.stopped_because = f"turn limit ({self.max_turns}) reached"
        self.report.task_status = self.backend.task(self.task_id).get("status", "")
        return self.report

    def record_turn(self, reply: BrainReply) -> None:
        """Record the answer as a ``brain_turn`` event; a failure is logged, not fatal."""
        tokens = reply.tokens
        if tokens is not None:
            self.report.input_tokens += tokens.input_tokens
            self.report.output_tokens += tokens.output_tokens
            self.report.total_tokens += tokens.total_tokens
        turn = {
            "brain": self.brain.name,
            "model": getattr(self.brain, "model", "") or "",
            "tool_calls": len(reply.tool_calls),
            "bad_calls": sum(1 for c in reply.tool_calls if c.error),
            "tokens": tokens.as_data() if tokens is not None else None,
        }
        try:
            self.backend.record_turn(self.task_id, turn)
        except ToolFailure as exc:
            self.on_event(f"{self.brain.name}: turn not recorded: {exc}")

    def call_tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        handlers = {
            "run_next_step": self._run_next_step,
            "rewrite_plan": self._rewrite_plan,
            "read_artifact": self._read_artifact,
            "read_resume_context": self._read_resume_context,
        }
        handler = handlers.get(name)
        if handler is None:
            return {
                "error": ERR_UNKNOWN_TOOL.format(name=name, names=", ".join(handlers))
            }
        try:
            result = handler(args)
        except ToolFailure as exc:
            result = {"error": str(exc)}
        self.on_event(f"{self.brain.name}: {name} -> {_summary(result)}")
        return result

    def _run_next_step(self, args: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.lease_wait
        while True:
            try:
                outcome = self.backend.run_step(self.task_id, self.worker)
                break
            except LeaseBusy:
                if time.monotonic() >= deadline:
                    raise ToolFailure(
                        ERR_LEASE_WAIT.format(seconds=self.lease_wait)
                    ) from None
                time.sleep(self.poll)
        if outcome.get("ran"):
            self.report.steps_run += 1
        step = outcome.get("step") or {}
        return {
            "ran": bool(outcome.get("ran")),
            "detail": outcome.get("detail", ""),
            "rule": outcome.get("rule", ""),
            "step": {
                k: step.get(k)
                for k in ("id", "position", "title", "status", "error", "output")
            }
            if step
            else None,
            "task": _compact(outcome.get("task") or {}),
        }

    def _rewrite_plan(self, args: dict[str, Any]) -> dict[str, Any]:
        steps = args.get("steps")
        if not isinstance(steps, list):
            raise ToolFailure(
                ERR_BAD_ARGS.format(
                    name="rewrite_plan",
                    reason=ERR_STEPS_NOT_LIST.format(
                        kind="nothing" if steps is None else json_kind(steps)
                    ),
                )
            )
        # Everything else (an empty plan, a step without a title, args that
        # are not an object) is the plan service's to refuse, in its words.
        # A plan is only rewritten while no worker holds the lease, this one included.
        self.backend.release_lease(self.task_id, self.worker)
        task = self.backend.rewrite_plan(self.task_id, steps)
        return {
            "task": _compact(task),
            "steps": [
                {k: s.get(k) for k in ("id", "position", "title", "tool", "status")}
                for s in task.get("steps", [])
            ],
        }

    def _read_artifact(self, args: dict[str, Any]) -> dict[str, Any]:
        artifact_id = args.get("artifact_id")
        if isinstance(artifact_id, float) and artifact_id.is_integer():
            artifact_id = int(artifact_id)
        if not isinstance(artifact_id, int) or isinstance(artifact_id, bool):
            raise ToolFailure(
                ERR_BAD_ARGS.format(
                    name="read_artifact",
                    reason=ERR_ARTIFACT_ID.format(value=json.dumps(artifact_id)[:80]),
                )
            )
        return self.backend.read_artifact(artifact_id)

    def _read_resume_context(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.backend.resume_context(self.task_id)


def _summary(result: dict[str, Any]) -> str:
    if result.get("error"):
        return f"error: {result['error']}"
    step = result.get("step") or {}
    task = result.get("task") or {}
    if step:
        return f"step {step.get('position')} {step.get('status')}; task {task.get('status')}"
    return ", ".join(f"{k}={v}" for k, v in list(result.items())[:3])


def run_brain(
    *, brain: BrainAdapter, backend: Backend, task_id: int, **kwargs
) -> RunReport:
    """Run ``brain`` on task ``task_id`` until it settles or stops; return a report."""
    return Runner(brain=brain, backend=backend, task_id=task_id, **kwargs).run()


# -- backends -------------------------------------------------------------------


class LocalBackend:
    """In-process services, owner-checked as ``user`` (the ``pippa_brain`` command).

    Its methods import the services they call, so this module (and
    ``HttpBackend``, for a runner on another machine) loads without a
    configured Django project.
    """

    def __init__(self, *, user):
        self.user = user

    def _task(self, task_id: int):
        from tasks.documents import task_get_for_user

        return task_get_for_user(user=self.user, task_id=task_id)

    def record_brain(self, task_id: int, brain: str) -> None:
        from tasks.services import task_brain_record

        task_brain_record(
            task=self._task(task_id), brain=brain, actor=f"runner:{brain}"
        )

    def record_turn(self, task_id: int, turn: dict[str, Any]) -> None:
        from tasks.usage import brain_turn_record

        try:
            brain_turn_record(task=self._task(task_id), **turn)
        except PippaError as exc:
            raise ToolFailure(str(exc)) from None

    def resume_context(self, task_id: int) -> dict[str, Any]:
        from tasks.resume import resume_context

        return json.loads(json.dumps(resume_context(self._task(task_id)), default=str))

    def task(self, task_id: int) -> dict[str, Any]:
        from tasks.documents import task_payload

        return task_payload(self._task(task_id))

    def run_step(self, task_id: int, worker: str) -> dict[str, Any]:
        from tasks.actions import step_run
        from tasks.documents import step_run_payload

        task = self._task(task_id)
        result = step_run(task=task, worker_id=worker)
        if result.lease_busy:
            raise LeaseBusy(result.detail)
        return step_run_payload(result, task)

    def resume(self, task_id: int) -> dict[str, Any]:
        from tasks.actions import task_resume
        from tasks.documents import task_payload

        try:
            task = task_resume(task=self._task(task_id), actor=f"runner:{self.user}")
        except PippaError as exc:
            raise ToolFailure(str(exc)) from None
        return task_payload(task)

    def release_lease(self, task_id: int, worker: str) -> None:
        from tasks.lease import lease_release_own

        lease_release_own(task=self._task(task_id), worker_id=worker)

    def rewrite_plan(self, task_id: int, steps: list[dict]) -> dict[str, Any]:
        from tasks.documents import task_payload
        from tasks.plan import plan_rewrite

        try:
            task = plan_rewrite(task=self._task(task_id), steps=steps)
        except PippaError as exc:
            raise ToolFailure(str(exc)) from None
        return task_payload(task)

    def read_artifact(self, artifact_id: int) -> dict[str, Any]:
        from django.http import Http404

        from artifacts.store import BlobMissing, default_store
        from tasks.documents import artifact_get, artifact_payload

        try:
            artifact = artifact_get(user=self.user, artifact_id=artifact_id)
        except Http404 as exc:
            raise ToolFailure(str(exc)) from None
        payload = json.loads(json.dumps(artifact_payload(artifact), default=str))
        try:
            head = default_store().head(artifact.sha256, MAX_EXCERPT_BYTES + 1)
        except BlobMissing:
            return {**payload, "error": "the artifact's payload is missing"}
        return {**payload, **_excerpt(head, artifact.media_type)}


class HttpBackend:
    """The JSON API at ``base_url`` (e.g. http://host:8000) with a bearer token."""

    def __init__(self, *, base_url: str, token: str, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/") + "/api/v1"
        self.token = token
        self.timeout = timeout

    def _call(
        self, method: str, path: str, body: Any = None, *, raw_limit: int = 0
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                content = response.read(raw_limit) if raw_limit else response.read()
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                body = {}
            if not isinstance(body, dict):
                body = {}
            detail = body.get("detail", exc.reason)
            # The refusal's code, never its words, says "another worker holds the lease".
            if body.get("code") == LeaseConflict.code:
                raise LeaseBusy(detail) from None
            if 400 <= exc.code < 500:
                raise ToolFailure(f"{exc.code}: {detail}") from None
            raise ToolFailure(ERR_SERVER.format(status=exc.code, path=path)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ToolFailure(
                ERR_UNREACHABLE.format(url=self.base_url, reason=reason)
            ) from None
        return content if raw_limit else json.loads(content)

    def record_brain(self, task_id: int, brain: str) -> None:
        self._call("POST", f"/tasks/{task_id}/brain", {"brain": brain})

    def record_turn(self, task_id: int, turn: dict[str, Any]) -> None:
        self._call("POST", f"/tasks/{task_id}/brain/turns", turn)

    def resume_context(self, task_id: int) -> dict[str, Any]:
        return self._call("GET", f"/tasks/{task_id}/resume-context")

    def task(self, task_id: int) -> dict[str, Any]:
        return self._call("GET", f"/tasks/{task_id}")

    def run_step(self, task_id: int, worker: str) -> dict[str, Any]:
        return self._call(
            "POST", f"/tasks/{task_id}/steps/run", {"worker": worker[:80]}
        )

    def rewrite_plan(self, task_id: int, steps: list[dict]) -> dict[str, Any]:
        return self._call("PUT", f"/tasks/{task_id}/plan", {"steps": steps})

    def resume(self, task_id: int) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/resume", {})

    def release_lease(self, task_id: int, worker: str) -> None:
        self._call("POST", f"/tasks/{task_id}/lease/release", {"worker": worker[:80]})

    def read_artifact(self, artifact_id: int) -> dict[str, Any]:
        meta = self._call("GET", f"/artifacts/{artifact_id}")
        head = self._call(
            "GET", f"/artifacts/{artifact_id}/content", raw_limit=MAX_EXCERPT_BYTES + 1
        )
        return {**meta, **_excerpt(head, meta["media_type"])}
