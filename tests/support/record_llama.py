"""Record real answers of llama.cpp's server for the fast suite's fixture file.

Run against a live server with the ``local`` extra installed:

    .venv/bin/python -m tests.support.record_llama [BASE_URL]

(without BASE_URL it starts one with ``brains.local.LocalModelServer``). It
writes ``tests/brains/fixtures/llama_cpp.json``: each entry is a request
exactly as the OpenAI-compatible adapter builds it (or, for the first, as it
built it before ``content: ""``), the HTTP status and the server's answer:

- ``content_null``: a second turn whose tool-call turn has ``"content": null``;
- ``content_empty``: the same turn with ``"content": ""``;
- ``arguments_cut``: a call to ``rewrite_plan`` whose arguments stop after a
  few tokens (``max_tokens``, which the server applies to a named tool), as a
  small model's do when it runs out of room: not JSON;
- ``empty_plan``: a call to ``rewrite_plan`` asked for in so many words, at
  temperature 0, whose arguments are ``{ "steps": [] }``;
- ``turns``: the answers of a short real run on the demo task's opening, one
  per turn, whatever the model sent (empty plans included); each turn is
  built as the runner builds it (``Runner.turn_messages``: the resume
  document, then the latest turn), in the room of a 4,096-token context.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from brains.base import Message, ToolCall
from brains.openai_compat import OpenAICompatBrain
from brains.runner import SYSTEM_PROMPT, TOOL_SPECS, Room, Runner, Turn

FIXTURE = (
    Path(__file__).resolve().parent.parent / "brains" / "fixtures" / "llama_cpp.json"
)
MODEL = "SmolLM2-135M-Instruct"
CONTEXT_TOKENS = 4096
# The resume document of a fresh three-step demo task (``pippa.resume/3``, as
# ``tasks.resume_document`` writes it), which the runner opens every turn with.
DOCUMENT = {
    "schema": "pippa.resume/3",
    "task": {
        "id": 1,
        "conversation_id": 1,
        "title": "Chart PIPA with a local model",
        "status": "queued",
        "brain": "ollama",
        "steps_total": 3,
        "steps_done": 0,
        "lease_owner": "",
        "branched_from": None,
        "branched_after_step": None,
    },
    "counts": {"pending": 3},
    "next": [
        {
            "id": n,
            "position": n,
            "title": title,
            "status": "pending",
            "tool": tool,
            "args": args,
            "args_chars": len(json.dumps(args)),
            "artifact_class": n + 1,
            "side_effects": False,
            "attempts": 0,
            "max_attempts": 3,
            "error": "",
            "idempotency_key": f"pippa:1:{n}:0",
            "resume": {"rule": "run", "words": "will run (attempt 1 of 3)"},
        }
        for n, (title, tool, args) in enumerate(
            [
                (
                    "Fetch unadjusted daily closes",
                    "demo.closes",
                    {"symbol": "PIPA", "start": "2024-01-02", "end": "2024-06-28"},
                ),
                ("Search the news", "demo.search", {"query": "PIPA dividend mill"}),
                (
                    "Chart the closes",
                    "demo.chart",
                    {"source": 1, "title": "PIPA daily closes, H1 2024"},
                ),
            ],
            start=1,
        )
    ],
    "later": 0,
    "recent": [],
    "earlier_done": 0,
    "read_steps": "every step is listed here",
    "note": None,
    "trimmed": [],
}


class DocumentOnly:
    """A runner's backend that only answers the resume document (recording)."""

    def resume_context(self, task_id: int, max_chars: int = 4000) -> dict:
        return DOCUMENT


def runner(brain) -> Runner:
    return Runner(
        brain=brain,
        backend=DocumentOnly(),
        task_id=1,
        room=Room.for_context(CONTEXT_TOKENS),
    )


EMPTY_ASK = (
    "The plan must be emptied. Call rewrite_plan with no steps at all: "
    "an empty list, steps = []."
)
FIRST_CALL = ToolCall(id="call_1", name="run_next_step", arguments={})
STEP_RESULT = {
    "ran": True,
    "step": {"position": 1, "title": "Fetch unadjusted daily closes", "status": "done"},
    "task": {"id": 1, "status": "running", "steps_done": 1, "steps_total": 3},
}


def opening() -> str:
    """The first message the runner sends for a fresh three-step demo task."""
    return runner(adapter("http://127.0.0.1:9/v1")).turn_messages([])[0].text


def conversation() -> list[Message]:
    return [
        Message(role="user", text=opening()),
        Message(role="assistant", text="", tool_calls=[FIRST_CALL]),
        Message(
            role="tool",
            tool_call_id=FIRST_CALL.id,
            tool_name=FIRST_CALL.name,
            result=STEP_RESULT,
        ),
    ]


def adapter(base_url: str) -> OpenAICompatBrain:
    return OpenAICompatBrain(model=MODEL, brain="ollama", base_url=base_url)


def post(base_url: str, body: dict) -> tuple[int, dict | str]:
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode("utf-8", "replace")
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw


def record(base_url: str, turns: int = 4) -> dict:
    brain = adapter(base_url)
    second = brain.request_body(
        system=SYSTEM_PROMPT, messages=conversation(), tools=TOOL_SPECS
    )
    null = json.loads(json.dumps(second))
    null["messages"][2]["content"] = None
    entries = {}
    for name, body in (("content_null", null), ("content_empty", second)):
        status, answer = post(base_url, body)
        entries[name] = {"request": body, "status": status, "answer": answer}
        print(name, status, file=sys.stderr)
    cut = brain.request_body(
        system=SYSTEM_PROMPT, messages=conversation()[:1], tools=TOOL_SPECS
    )
    cut["tool_choice"] = {"type": "function", "function": {"name": "rewrite_plan"}}
    cut["max_tokens"] = 12
    status, answer = post(base_url, cut)
    entries["arguments_cut"] = {"request": cut, "status": status, "answer": answer}
    print("arguments_cut", status, file=sys.stderr)
    empty = brain.request_body(
        system="You call functions exactly as the user asks.",
        messages=[Message(role="user", text=EMPTY_ASK)],
        tools=TOOL_SPECS,
    )
    empty["tool_choice"] = {"type": "function", "function": {"name": "rewrite_plan"}}
    empty["max_tokens"] = 40
    empty["temperature"] = 0
    status, answer = post(base_url, empty)
    entries["empty_plan"] = {"request": empty, "status": status, "answer": answer}
    print("empty_plan", status, file=sys.stderr)
    run = runner(brain)
    window: list[Turn] = []
    answers = []
    for _ in range(turns):
        messages = run.turn_messages(window)
        body = brain.request_body(
            system=SYSTEM_PROMPT, messages=messages, tools=TOOL_SPECS
        )
        status, answer = post(base_url, body)
        answers.append({"status": status, "answer": answer})
        print("turn", len(answers), status, file=sys.stderr)
        if status != 200:
            break
        reply = brain.parse_reply(answer)
        if not reply.tool_calls:
            break
        turn = Turn(reply=reply.as_message())
        for call in reply.tool_calls:
            turn.results.append(
                Message(
                    role="tool",
                    tool_call_id=call.id,
                    tool_name=call.name,
                    result={"error": call.error or "recorded run: not carried out"},
                )
            )
        window.append(turn)
    entries["turns"] = {"opening": opening(), "answers": answers}
    return entries


def main() -> None:
    if len(sys.argv) > 1:
        entries = record(sys.argv[1].rstrip("/"))
    else:
        from brains.local import LocalModelServer

        with LocalModelServer(context_tokens=CONTEXT_TOKENS) as server:
            entries = record(server.base_url)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
