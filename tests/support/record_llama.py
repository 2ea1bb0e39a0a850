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
  per turn, whatever the model sent (empty plans included).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from brains.base import Message, ToolCall
from brains.openai_compat import OpenAICompatBrain
from brains.runner import SYSTEM_PROMPT, TOOL_SPECS

FIXTURE = (
    Path(__file__).resolve().parent.parent / "brains" / "fixtures" / "llama_cpp.json"
)
MODEL = "SmolLM2-135M-Instruct"
# The opening a runner sends for a fresh three-step demo task (resume context
# shortened to what the model needs to see).
OPENING = (
    "Task 1. Resume context (JSON, from durable state):\n"
    '{"task": {"id": 1, "status": "queued", "steps_done": 0, "steps_total": 3}, '
    '"steps": [{"position": 1, "title": "Fetch unadjusted daily closes", '
    '"status": "pending", "tool": "demo.closes"}, {"position": 2, "title": '
    '"Search the news", "status": "pending", "tool": "demo.search"}, '
    '{"position": 3, "title": "Chart the closes", "status": "pending", "tool": '
    '"demo.chart"}]}\nContinue the task from where it stands.'
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


def conversation() -> list[Message]:
    return [
        Message(role="user", text=OPENING),
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
    messages = conversation()[:1]
    answers = []
    for _ in range(turns):
        body = brain.request_body(
            system=SYSTEM_PROMPT, messages=messages, tools=TOOL_SPECS
        )
        status, answer = post(base_url, body)
        answers.append({"status": status, "answer": answer})
        print("turn", len(answers), status, file=sys.stderr)
        if status != 200:
            break
        reply = brain.parse_reply(answer)
        messages.append(reply.as_message())
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(
                Message(
                    role="tool",
                    tool_call_id=call.id,
                    tool_name=call.name,
                    result={"error": call.error or "recorded run: not carried out"},
                )
            )
    entries["turns"] = {"opening": OPENING, "answers": answers}
    return entries


def main() -> None:
    if len(sys.argv) > 1:
        entries = record(sys.argv[1].rstrip("/"))
    else:
        from brains.local import LocalModelServer

        with LocalModelServer() as server:
            entries = record(server.base_url)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
