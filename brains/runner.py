"""Drive one task with one brain: the brain decides, the executor does.

A brain reads state, not a chat log. Every turn the runner sends is built
afresh from the task's durable state (``Runner.turn_messages``):

1. the system prompt;
2. the resume document as it is now (``tasks.resume_document``, bounded: the
   steps counted by status, the next few, the last few finished with their
   refs and excerpts, the brain's note), in one user message;
3. at most a few of the brain's own latest turns (``Room.window_turns``),
   each with the results of its calls: the latest turn's results whole (the
   result of the call just made), older ones shortened to a line.

Nothing older is sent again, so what a turn costs does not grow with the
task. What a brain must carry from turn to turn lives in the task: the plan,
the outputs, and a short note it writes with ``write_note``; a run cut and
started again reads the same document and loses nothing. Each vendor still
gets a valid request: a turn kept is sent as the brain answered it (Gemini's
thought signatures ride along, ``BrainReply.replay``), and each result right
after the call it answers.

The brain's tools (``brains.prompt``, with the system prompt and each turn's
opening), each carried out through Pippa's durable state:

- ``run_next_step``: the executor runs the next unfinished step; the result
  is handed to the brain only after it is persisted;
- ``read_steps``: steps the document does not list, a page at a time;
- ``read_artifact``: an artifact by ref (metadata and a text excerpt);
- ``write_note``: the brain's note on the task (a class-3 artifact);
- ``rewrite_plan``: replace the not-yet-run part of the plan.

A step whose work an agent did itself is recorded with ``complete_step``
over the API or MCP; the runner does not offer it: a brain driving the
executor runs each step's tool, and a small model must not mark steps done
with text of its own.

``Room`` bounds what a turn sends: the document's size, the window, one
result's size and, for a small context (``Room.for_context``), the whole
request, shortening the window before anything else.

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
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlencode

from brains.base import (
    BrainAdapter,
    BrainError,
    BrainReply,
    Message,
    ToolSpec,
    json_kind,
    message_chars,
)
from brains.prompt import (
    ELIDED,
    GO_ON_FIRST,
    GO_ON_LATER,
    NEXT_RUNS,
    NEXT_WAITS,
    NOTHING_LEFT,
    OPENING,
    SYSTEM_PROMPT,
    TOOL_SPECS,
)
from pippa_site.errors import LeaseConflict, PippaError
from tasks.limits import DOCUMENT_MAX_CHARS, DOCUMENT_MIN_CHARS, WORKER_NAME_MAX

logger = logging.getLogger("pippa.brains")

MAX_EXCERPT_BYTES = 4096
TEXT_TYPES = ("text/", "application/json", "image/svg+xml", "application/xml")
# The share of a bounded context (``Room.context_tokens``) a request may fill;
# the rest is the answer's.
ANSWER_SHARE = 3 / 4
# How many times a request a bounded brain refused as too long is sent again,
# smaller (``Runner._ask``).
CONTEXT_RETRIES = 2
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
ERR_WHOLE_NUMBER = "{field} must be a whole number, not {value}"
ERR_NOTE_TEXT = "text must be the note itself (a string), not {kind}"
ERR_RESULT_TOO_LARGE = (
    "the answer of {name} is {size:,} characters, more than this brain's room for"
    " one result ({room:,}): ask for less (read_steps with a smaller limit or a"
    " narrower range)"
)
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
    def resume_context(
        self, task_id: int, max_chars: int = DOCUMENT_MAX_CHARS
    ) -> dict[str, Any]: ...
    def task(self, task_id: int) -> dict[str, Any]: ...
    def run_step(self, task_id: int, worker: str) -> dict[str, Any]: ...
    def read_steps(self, task_id: int, query: dict[str, Any]) -> dict[str, Any]: ...
    def write_note(self, task_id: int, text: str) -> dict[str, Any]: ...
    def rewrite_plan(self, task_id: int, steps: list[dict]) -> dict[str, Any]: ...
    def read_artifact(self, artifact_id: int, limit: int) -> dict[str, Any]: ...
    def resume(self, task_id: int) -> dict[str, Any]: ...
    def release_lease(self, task_id: int, worker: str) -> None: ...


@dataclass(frozen=True)
class Room:
    """How much one turn sends: the bounds ``Runner.turn_messages`` keeps to.

    ``document_chars`` bounds the resume document (its own size rules shorten
    it), ``window_turns`` the brain's own latest turns sent again (at least
    one: the call just made, with its result), ``result_chars`` one call's
    result (a larger one is answered with an error that says to ask for
    less). With ``context_tokens`` (a brain with a small context, such as a
    local model) the whole request (system prompt, tool declarations and
    messages) is fitted into three quarters of it, the rest left for the
    answer: the window's older turns go first, then the latest turn's words,
    then its calls' arguments (a vendor that needs its turn back verbatim
    keeps it whole). Tokens are reckoned at ``chars_per_token`` until the
    brain's own counts (``BrainReply.tokens``) tell the runner better.
    """

    document_chars: int = DOCUMENT_MAX_CHARS
    window_turns: int = 2
    result_chars: int = 12_000
    context_tokens: int | None = None
    # JSON is dear in tokens: SmolLM2's tokenizer read these requests at about
    # two characters a token (tool declarations included, as its template
    # writes them).
    chars_per_token: float = 1.8

    @classmethod
    def for_context(cls, tokens: int) -> Room:
        """The room for a brain whose context holds ``tokens`` (a local model)."""
        prompt = int(tokens * ANSWER_SHARE * cls.chars_per_token)
        return cls(
            document_chars=max(
                DOCUMENT_MIN_CHARS, min(DOCUMENT_MAX_CHARS, int(prompt * 0.3))
            ),
            window_turns=1,
            result_chars=max(600, prompt // 8),
            context_tokens=tokens,
        )


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
    # Characters of the messages sent, each turn (``message_chars``).
    sent_chars: list[int] = field(default_factory=list)
    final_text: str = ""
    task_status: str = ""
    stopped_because: str = ""


@dataclass
class Turn:
    """One answer of the brain and the results of its calls, in call order."""

    reply: Message
    results: list[Message] = field(default_factory=list)


def _compact(task: dict[str, Any]) -> dict[str, Any]:
    """The small view of a task a brain needs after each step."""
    return {
        "id": task.get("id"),
        "status": task.get("status"),
        "steps_done": task.get("steps_done"),
        "steps_total": task.get("steps_total"),
    }


def _excerpt(data: bytes, media_type: str, limit: int) -> dict[str, Any]:
    if not media_type.startswith(TEXT_TYPES):
        return {"excerpt": None, "note": "binary payload; not shown"}
    text = data[:limit].decode("utf-8", "replace")
    return {"excerpt": text, "truncated": len(data) > limit}


def default_worker(brain: str) -> str:
    """A lease name unique to this process: two runners never share a lease."""
    return f"{brain}-{socket.gethostname()}-{os.getpid()}"[:80]


def request_chars(system: str, tools: list[ToolSpec], messages: list[Message]) -> int:
    """The characters of a whole request: its system prompt, tools and messages."""
    declared = sum(
        len(t.name) + len(t.description) + len(json.dumps(t.parameters)) for t in tools
    )
    return len(system) + declared + sum(message_chars(m) for m in messages)


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
        room: Room | None = None,
        on_event: Callable[[str], None] | None = None,
    ):
        self.brain = brain
        self.backend = backend
        self.task_id = task_id
        self.worker = worker or default_worker(brain.name)
        self.max_turns = max_turns
        self.lease_wait = lease_wait
        self.poll = poll
        self.room = room or Room()
        # Learnt from the brain's token counts (``Room.chars_per_token``).
        self.chars_per_token = self.room.chars_per_token
        self.on_event = on_event or (lambda line: logger.info("%s", line))
        self.report = RunReport(task_id=task_id, brain=brain.name)

    def turn_messages(self, window: list[Turn]) -> list[Message]:
        """Build this turn's messages from state: the document now, then the window."""
        document = self.backend.resume_context(
            self.task_id, max_chars=self.room.document_chars
        )
        kept = list(window[-max(1, self.room.window_turns) :])
        messages = self._messages(document, kept)
        budget = self.prompt_chars()
        if budget is None:
            return messages
        while len(kept) > 1 and self._size(messages) > budget:
            kept = kept[1:]
            messages = self._messages(document, kept)
        latest = kept[-1].reply if kept else None
        if latest is None or latest.replay or self._size(messages) <= budget:
            return messages
        # The brain's own words go first, then what its calls said (each
        # call keeps its id, so its result still answers it).
        too_much = self._size(messages) - budget
        words = latest.text[: max(0, len(latest.text) - too_much - 1)]
        shortened = replace(latest, text=words + "…" if latest.text else "")
        messages = self._messages(document, [replace(kept[-1], reply=shortened)])
        if self._size(messages) > budget:
            calls = [replace(c, arguments={}) for c in latest.tool_calls]
            shortened = replace(shortened, tool_calls=calls)
            messages = self._messages(document, [replace(kept[-1], reply=shortened)])
        return messages

    def prompt_chars(self) -> int | None:
        """The most characters a request may have, when the context is bounded."""
        if self.room.context_tokens is None:
            return None
        return int(self.room.context_tokens * ANSWER_SHARE * self.chars_per_token)

    @staticmethod
    def _size(messages: list[Message]) -> int:
        return request_chars(SYSTEM_PROMPT, TOOL_SPECS, messages)

    def _messages(self, document: dict[str, Any], window: list[Turn]) -> list[Message]:
        opening = OPENING.format(
            task_id=self.task_id,
            document=json.dumps(document, ensure_ascii=False),
            go_on=(GO_ON_LATER if window else GO_ON_FIRST) + _next_words(document),
        )
        messages = [Message(role="user", text=opening)]
        for n, turn in enumerate(window, start=1):
            messages.append(turn.reply)
            latest = n == len(window)
            messages += turn.results if latest else [_elided(r) for r in turn.results]
        return messages

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

    def _ask(self, window: list[Turn]) -> tuple[list[Message], BrainReply]:
        """Send this turn's request; return it with the brain's reply.

        In a bounded context the request is fitted by an estimate of the
        brain's characters a token, which a denser request can outrun: a
        server that says its context is full is asked again with less (the
        estimate cut by a quarter, at most twice) instead of ending the run.
        """
        for attempt in range(CONTEXT_RETRIES + 1):
            messages = self.turn_messages(window)
            try:
                reply = self.brain.complete(
                    system=SYSTEM_PROMPT, messages=messages, tools=TOOL_SPECS
                )
            except BrainError as exc:
                if attempt == CONTEXT_RETRIES or not self._context_full(exc):
                    raise
                self.chars_per_token *= 0.75
                self.on_event(
                    f"{self.brain.name}: the request did not fit its context; "
                    "sending less"
                )
                continue
            self.report.sent_chars.append(sum(message_chars(m) for m in messages))
            return messages, reply
        raise AssertionError("unreachable")

    def _context_full(self, exc: BrainError) -> bool:
        """Whether a bounded brain refused a request for its length (HTTP 400
        naming the context, as llama.cpp, Ollama and OpenAI say it)."""
        return (
            self.room.context_tokens is not None
            and exc.status == 400
            and "context" in str(exc).lower()
        )

    def _loop(self) -> RunReport:
        window: list[Turn] = []
        for _ in range(self.max_turns):
            messages, reply = self._ask(window)
            self.report.turns += 1
            self.record_turn(reply)
            if reply.tokens is not None and reply.tokens.input_tokens > 0:
                # What this brain's tokens hold, with a tenth to spare.
                measured = self._size(messages) / reply.tokens.input_tokens
                self.chars_per_token = measured * 0.9
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
            # as_message() keeps what the vendor wants back (e.g. signatures).
            turn = Turn(reply=reply.as_message())
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
                turn.results.append(
                    Message(
                        role="tool",
                        tool_call_id=call.id,
                        tool_name=call.name,
                        result=result,
                    )
                )
            window = [*window, turn][-max(1, self.room.window_turns) :]
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
            "read_steps": self._read_steps,
            "write_note": self._write_note,
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
        size = len(json.dumps(result, ensure_ascii=False, default=str))
        if size > self.room.result_chars:
            result = {
                "error": ERR_RESULT_TOO_LARGE.format(
                    name=name, size=size, room=self.room.result_chars
                )
            }
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

    def _read_steps(self, args: dict[str, Any]) -> dict[str, Any]:
        query = {}
        for key in ("from_position", "to_position", "limit"):
            if args.get(key) is not None:
                query[key] = _whole_number("read_steps", key, args[key])
        status = args.get("status")
        if status not in (None, ""):
            query["status"] = str(status)
        page = self.backend.read_steps(self.task_id, query)
        # What a brain needs of each step; the rest is for programs.
        keep = ("id", "position", "title", "status", "tool", "args", "error", "output")
        return {
            **{k: v for k, v in page.items() if k != "steps"},
            "steps": [{k: s.get(k) for k in keep} for s in page.get("steps", [])],
        }

    def _write_note(self, args: dict[str, Any]) -> dict[str, Any]:
        text = args.get("text")
        if not isinstance(text, str):
            raise _bad_args("write_note", ERR_NOTE_TEXT.format(kind=_kind(text)))
        note = self.backend.write_note(self.task_id, text)
        return {"saved": True, "artifact_id": note.get("artifact_id")}

    def _rewrite_plan(self, args: dict[str, Any]) -> dict[str, Any]:
        steps = args.get("steps")
        if not isinstance(steps, list):
            raise _bad_args(
                "rewrite_plan", ERR_STEPS_NOT_LIST.format(kind=_kind(steps))
            )
        # Everything else (an empty plan, a step without a title, args that
        # are not an object) is the plan service's to refuse, in its words.
        # A plan is only rewritten while no worker holds the lease, this one included.
        self.backend.release_lease(self.task_id, self.worker)
        task = self.backend.rewrite_plan(self.task_id, steps)
        entries = [
            {k: s.get(k) for k in ("id", "position", "title", "tool", "status")}
            for s in task.get("steps", [])
        ]
        # As many steps as fit in half a result; the next turn's resume
        # context shows where the new plan goes on, and read_steps the rest.
        listed, size = [], 0
        for entry in entries:
            size += len(json.dumps(entry, ensure_ascii=False)) + 2
            if size > self.room.result_chars // 2:
                break
            listed.append(entry)
        answer = {"task": _compact(task), "steps": listed}
        if len(listed) < len(entries):
            answer["steps_not_listed"] = len(entries) - len(listed)
        return answer

    def _read_artifact(self, args: dict[str, Any]) -> dict[str, Any]:
        artifact_id = _whole_number(
            "read_artifact", "artifact_id", args.get("artifact_id")
        )
        # The excerpt leaves room in one result for the artifact's metadata.
        limit = max(256, min(MAX_EXCERPT_BYTES, self.room.result_chars - 1200))
        return self.backend.read_artifact(artifact_id, limit)


def _whole_number(tool: str, field: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        reason = (
            ERR_ARTIFACT_ID.format(value=json.dumps(value)[:80])
            if field == "artifact_id"
            else ERR_WHOLE_NUMBER.format(field=field, value=json.dumps(value)[:80])
        )
        raise _bad_args(tool, reason)
    return value


def _bad_args(tool: str, reason: str) -> ToolFailure:
    return ToolFailure(ERR_BAD_ARGS.format(name=tool, reason=reason))


def _kind(value: Any) -> str:
    return "nothing" if value is None else json_kind(value)


def _next_words(document: dict[str, Any]) -> str:
    """The document's next step in a sentence (a small model needs it said)."""
    upcoming = document.get("next") or []
    if not upcoming:
        return NOTHING_LEFT
    step = upcoming[0]
    words = (
        NEXT_WAITS if step.get("status") in ("failed", "needs_review") else NEXT_RUNS
    )
    return words.format(position=step.get("position"), title=step.get("title"))


def _elided(result: Message) -> Message:
    """An older turn's result, shortened to a line (it still answers its call)."""
    return replace(
        result, result={"earlier": ELIDED, "summary": _summary(result.result or {})}
    )


def _summary(result: dict[str, Any]) -> str:
    if result.get("error"):
        return f"error: {str(result['error'])[:200]}"
    step = result.get("step") or {}
    task = result.get("task") or {}
    if step:
        return f"step {step.get('position')} {step.get('status')}; task {task.get('status')}"
    return ", ".join(f"{k}={str(v)[:60]}" for k, v in list(result.items())[:3])


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

    def resume_context(
        self, task_id: int, max_chars: int = DOCUMENT_MAX_CHARS
    ) -> dict[str, Any]:
        from tasks.resume_document import resume_payload

        return resume_payload(self._task(task_id), max_chars=max_chars)

    def read_steps(self, task_id: int, query: dict[str, Any]) -> dict[str, Any]:
        from tasks.resume_document import steps_read

        try:
            page = steps_read(task=self._task(task_id), **query)
        except PippaError as exc:
            raise ToolFailure(str(exc)) from None
        return page.model_dump(mode="json")

    def write_note(self, task_id: int, text: str) -> dict[str, Any]:
        from tasks.resume_document import note_document
        from tasks.services import task_note_write

        task = self._task(task_id)
        try:
            task_note_write(task=task, text=text, actor=f"runner:{self.user}")
        except PippaError as exc:
            raise ToolFailure(str(exc)) from None
        return note_document(task).model_dump(mode="json")

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

    def read_artifact(
        self, artifact_id: int, limit: int = MAX_EXCERPT_BYTES
    ) -> dict[str, Any]:
        from artifacts.store import BlobMissing, default_store
        from pippa_site.errors import NotFound
        from tasks.documents import artifact_get, artifact_payload

        try:
            artifact = artifact_get(user=self.user, artifact_id=artifact_id)
        except NotFound as exc:
            raise ToolFailure(str(exc)) from None
        payload = json.loads(json.dumps(artifact_payload(artifact), default=str))
        try:
            head = default_store().head(artifact.sha256, limit + 1)
        except BlobMissing:
            return {**payload, "error": "the artifact's payload is missing"}
        return {**payload, **_excerpt(head, artifact.media_type, limit)}


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

    def resume_context(
        self, task_id: int, max_chars: int = DOCUMENT_MAX_CHARS
    ) -> dict[str, Any]:
        return self._call(
            "GET", f"/tasks/{task_id}/resume-context?max_chars={int(max_chars)}"
        )

    def read_steps(self, task_id: int, query: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", f"/tasks/{task_id}/steps?{urlencode(query)}")

    def write_note(self, task_id: int, text: str) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/note", {"text": text})

    def task(self, task_id: int) -> dict[str, Any]:
        return self._call("GET", f"/tasks/{task_id}")

    def run_step(self, task_id: int, worker: str) -> dict[str, Any]:
        return self._call(
            "POST", f"/tasks/{task_id}/steps/run", {"worker": worker[:WORKER_NAME_MAX]}
        )

    def rewrite_plan(self, task_id: int, steps: list[dict]) -> dict[str, Any]:
        return self._call("PUT", f"/tasks/{task_id}/plan", {"steps": steps})

    def resume(self, task_id: int) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/resume", {})

    def release_lease(self, task_id: int, worker: str) -> None:
        self._call(
            "POST",
            f"/tasks/{task_id}/lease/release",
            {"worker": worker[:WORKER_NAME_MAX]},
        )

    def read_artifact(
        self, artifact_id: int, limit: int = MAX_EXCERPT_BYTES
    ) -> dict[str, Any]:
        meta = self._call("GET", f"/artifacts/{artifact_id}")
        head = self._call(
            "GET", f"/artifacts/{artifact_id}/content", raw_limit=limit + 1
        )
        return {**meta, **_excerpt(head, meta["media_type"], limit)}
