"""Tools for tests, loaded like a user's own module (``PIPPA_TOOLS=tests.support.tools``).

Each call appends a line to ``$PIPPA_TOOL_LOG`` when set (the side channel the
crash tests count real invocations with). ``fill=PATH`` makes a call fill the
disk under PATH once, after its work is done: the tool ran, and then its
output meets a full disk (see ``tests/support/faults.py``).
"""

from __future__ import annotations

import os
import time

from tasks.demo.tools import side_channel_note
from tasks.tools import ToolContext, ToolResult, tool


def _note(ctx: ToolContext, name: str, phase: str) -> None:
    # The same side channel the demo tools write: one JSON line per call.
    side_channel_note(ctx, name, phase)


def _fill(path: str) -> None:
    if path:
        from tests.support.faults import fill_once

        fill_once(path)


def _payload(ctx: ToolContext, size: int, stable: bool) -> bytes:
    head = f"task {ctx.task_id} step {ctx.step_id} gen {ctx.generation}"
    if not stable:
        head += f" at {time.time_ns()} pid {os.getpid()}"
    body = (head + " ").encode()
    return (body * (size // len(body) + 1))[:size]


@tool("test.fetch", artifact_class=2, media_type="text/plain")
def fetch(
    ctx: ToolContext,
    *,
    size: int = 256,
    sleep: float = 0,
    fill: str = "",
    media_type: str = "",
) -> ToolResult:
    """Idempotent: the same bytes for the same step (``media_type``: what the
    tool says they are, in place of its declared type)."""
    _note(ctx, "test.fetch", "start")
    time.sleep(sleep)
    _note(ctx, "test.fetch", "end")
    _fill(fill)
    return ToolResult(data=_payload(ctx, size, stable=True), media_type=media_type)


@tool("test.snapshot", artifact_class=3, media_type="text/plain")
def snapshot(
    ctx: ToolContext,
    *,
    size: int = 256,
    sleep: float = 0,
    fill: str = "",
    sleep_first: float = 0,
) -> ToolResult:
    """Non-deterministic: different bytes every call.

    ``sleep_first`` hangs only the first attempt (a call cut off mid-way).
    """
    _note(ctx, "test.snapshot", "start")
    time.sleep(sleep + (sleep_first if ctx.attempt == 1 else 0))
    _note(ctx, "test.snapshot", "end")
    _fill(fill)
    return ToolResult(data=_payload(ctx, size, stable=False))


@tool("test.file", artifact_class=1, media_type="text/plain")
def file(ctx: ToolContext, *, size: int = 256, sleep: float = 0) -> ToolResult:
    """Writes a file (stable content) and hands back its path."""
    _note(ctx, "test.file", "start")
    time.sleep(sleep)
    path = ctx.file_write("out.txt", _payload(ctx, size, stable=True))
    _note(ctx, "test.file", "end")
    return ToolResult(path=path)


@tool("test.render", artifact_class=4, media_type="text/plain")
def render(ctx: ToolContext, *, source: int = 1, sleep: float = 0) -> ToolResult:
    """Derived from an earlier step's output."""
    _note(ctx, "test.render", "start")
    time.sleep(sleep)
    src = ctx.output(source)
    data = b"render of " + ctx.read(source)[:64]
    _note(ctx, "test.render", "end")
    return ToolResult(data=data, source_ids=[src.pk])


@tool("test.effect", artifact_class=2, side_effects=True, media_type="text/plain")
def effect(ctx: ToolContext, *, sleep: float = 0, fill: str = "") -> ToolResult:
    """Has outside effects: never re-run from an uncertain state."""
    _note(ctx, "test.effect", "start")
    time.sleep(sleep)
    _note(ctx, "test.effect", "end")
    _fill(fill)
    return ToolResult(data=f"sent with key {ctx.idempotency_key}".encode())


@tool("test.flaky", artifact_class=2, media_type="text/plain")
def flaky(ctx: ToolContext, *, fail_times: int = 1) -> ToolResult:
    """Fails on its first ``fail_times`` attempts of a generation."""
    _note(ctx, "test.flaky", "start")
    if ctx.attempt <= fail_times:
        raise ConnectionError(f"flaky failure on attempt {ctx.attempt}")
    return ToolResult(data=f"ok after {ctx.attempt}".encode())


def _unclassed(ctx: ToolContext) -> ToolResult:
    return ToolResult(data=b"no class declared")


tool("test.unclassed")(_unclassed)
