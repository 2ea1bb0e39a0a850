"""What the MCP tools answer with: pages and their cursors, documents with uris."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mcp.server.mcpserver.exceptions import (
    ToolError,
)

from artifacts.selectors import artifact_text_head
from pippa_mcp.shapes import (
    ConversationItem,
    TaskBrief,
)
from tasks.documents import (
    artifact_payload,
    conversation_payload,
    task_payload,
    task_summary,
)
from tasks.models import Conversation, Step, Task

MAX_SOURCE_CHARS = 256 * 1024
EXCERPT_BYTES = 600
ERR_BASE64 = "content is not valid base64 (encoding='base64')"
ERR_NO_STEP = "step {step} is not a step of task {task}"
ERR_CURSOR = (
    "cursor {cursor!r} is not one {listing} gave out; leave it out to start"
    " from the first page"
)


def cursor_read(cursor: str | None, listing: str) -> Any:
    """The key a page starts after, from a cursor this listing gave out; else a refusal."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        kind, after = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        kind, after = None, None
    if kind != listing or isinstance(after, bool) or not isinstance(after, int | str):
        raise ToolError(ERR_CURSOR.format(cursor=cursor[:40], listing=listing))
    return after


def cursor_after(listing: str, after: int | str) -> str:
    raw = json.dumps([listing, after]).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def page_of(rows, limit: int) -> tuple[list, bool]:
    """The first ``limit`` rows, and whether there are more (one row is read past)."""
    taken = list(rows[: limit + 1])
    return taken[:limit], len(taken) > limit


def page_message(count: int, *, more: bool, first: bool, noun: str, empty: str) -> str:
    """What a page holds, in a sentence a model reads even when it is empty."""
    if not count:
        return empty if first else f"No more {noun}: the page before was the last."
    words = f"{count} {noun}"
    return (
        f"{words}; more on the next page (pass next_cursor)." if more else f"{words}."
    )


# -- documents ------------------------------------------------------------------------


def uri_of(kind: str, pk: int) -> str:
    return f"pippa://{kind}/{pk}"


def plain_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def task_doc(task: Task) -> dict[str, Any]:
    """The task document (``TaskDoc``): the plan, each output ref with its uri."""
    doc = task_payload(task)
    doc["uri"] = uri_of("task", task.pk)
    for step in doc["steps"]:
        if step["output"]:
            step["output"]["uri"] = uri_of("artifact", step["output"]["id"])
    return plain_json(doc)


def task_brief(task: Task, *, refresh: bool = True) -> TaskBrief:
    """A task without its steps (``task_summary``, the one shape), with its uri."""
    if refresh:
        task.refresh_from_db()
    return TaskBrief(**task_summary(task), uri=uri_of("task", task.pk))


def artifact_doc(artifact) -> dict[str, Any]:
    doc = plain_json(artifact_payload(artifact))
    doc["uri"] = uri_of("artifact", artifact.pk)
    return doc


def conversation_doc(conversation: Conversation) -> ConversationItem:
    return ConversationItem(
        **conversation_payload(conversation),
        uri=uri_of("conversation", conversation.pk),
    )


def excerpt_of(artifact) -> dict[str, Any]:
    head = artifact_text_head(artifact=artifact, limit=EXCERPT_BYTES)
    if head.missing:
        return {"excerpt": None, "note": "the payload is missing"}
    if not head.is_text:
        return {"excerpt": None, "note": f"{artifact.media_type}: not text"}
    return {"excerpt": head.text, "truncated": head.truncated}


def content_bytes(content: str, encoding: str) -> bytes:
    """The bytes an agent sent as text, or as base64 with encoding='base64'."""
    if encoding != "base64":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError(ERR_BASE64) from None


def step_get(task: Task, step_id: int) -> Step:
    step = Step.objects.select_related("task").filter(pk=step_id, task=task).first()
    if step is None:
        raise ToolError(ERR_NO_STEP.format(step=step_id, task=task.pk))
    return step
