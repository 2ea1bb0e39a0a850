"""A deterministic brain for the demo and the tests: no network, same moves every time.

Its policy is the one a careful model follows with the runner's tools: call
``run_next_step`` until the task is no longer running, then say how it ended.
A fixed ``script`` of replies can be given instead, for tests that need a
particular sequence (a plan rewrite, an artifact read, a bad call).
"""

from __future__ import annotations

from collections.abc import Iterable

from brains.base import BrainAdapter, BrainReply, Message, ToolCall, ToolSpec

# Task states in which another run_next_step would change nothing.
SETTLED = frozenset({"done", "failed", "needs_review", "paused"})


def next_move(messages: list[Message], *, turn: int = 0) -> BrainReply:
    """Return the scripted policy's reply to this turn's messages.

    It reads only the last result (the runner sends the state and the latest
    turns, not the whole run); ``turn`` numbers its call ids, unique in a run.
    """
    last = messages[-1] if messages else None
    if last is not None and last.role == "tool":
        result = last.result or {}
        status = (result.get("task") or {}).get("status", "")
        if result.get("error") or status in SETTLED or result.get("ran") is False:
            detail = result.get("error") or result.get("detail") or ""
            text = f"Stopping: the task is {status or 'not runnable'}. {detail}".strip()
            return BrainReply(text=text, tool_calls=[], stop_reason="end_turn")
    return BrainReply(
        text="",
        tool_calls=[
            ToolCall(id=f"scripted-{turn + 1}", name="run_next_step", arguments={})
        ],
        stop_reason="tool_use",
    )


class ScriptedBrain(BrainAdapter):
    name = "scripted"
    vendor = "scripted"

    def __init__(
        self, script: Iterable[BrainReply] | None = None, *, brain: str = "scripted"
    ):
        self.name = brain
        self.script = list(script) if script is not None else None
        self.calls: list[list[Message]] = []

    def complete(
        self, *, system: str, messages: list[Message], tools: list[ToolSpec]
    ) -> BrainReply:
        self.calls.append(list(messages))
        if self.script is None:
            return next_move(messages, turn=len(self.calls) - 1)
        if not self.script:
            return BrainReply(
                text="Script finished.", tool_calls=[], stop_reason="end_turn"
            )
        return self.script.pop(0)
