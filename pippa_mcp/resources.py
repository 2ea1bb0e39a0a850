"""The ``pippa://`` resources (task, conversation, artifact), their listing and
the completion of their ids, each read owner-only like the tools."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from django.db.models import CharField
from django.db.models.functions import Cast
from mcp.server.mcpserver.exceptions import (
    ResourceNotFoundError,
    ToolError,
)
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    Completion,
    ListResourcesResult,
    PaginatedRequestParams,
    Resource,
    ResourceTemplateReference,
)

from artifacts.models import Artifact, ArtifactClass
from artifacts.selectors import artifact_text_head
from pippa_mcp.answers import (
    ERR_CURSOR,
    MAX_SOURCE_CHARS,
    artifact_doc,
    conversation_doc,
    page_of,
    task_doc,
    uri_of,
)
from pippa_mcp.arguments import PAGE_ROWS
from pippa_mcp.door import connected, current_user, guarded, in_thread, server
from tasks.documents import (
    artifact_get,
    conversation_get_for_user,
    task_get_for_user,
)
from tasks.models import Conversation, Task

# Ids a completion offers at most (the protocol's own limit).
MAX_COMPLETIONS = 100


# -- resources --------------------------------------------------------------------


def _resource_id(raw: str) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ResourceNotFoundError(f"{raw!r} is not an id") from None


def _resource_read(read: Callable[[], Any]) -> Any:
    """Run a resource read as a door: owner-checked, 404 as resource-not-found."""
    try:
        return connected(guarded(read))()
    except ToolError as exc:
        raise ResourceNotFoundError(str(exc)) from None


@server.resource(
    "pippa://task/{task_id}",
    name="task",
    description="A task and its plan with per-step status and output refs (JSON).",
    mime_type="application/json",
)
def task_resource(task_id: str) -> str:
    def read():
        return task_doc(
            task_get_for_user(user=current_user(), task_id=_resource_id(task_id))
        )

    return json.dumps(_resource_read(read))


@server.resource(
    "pippa://artifact/{artifact_id}",
    name="artifact",
    description=(
        "An artifact's metadata (JSON) and, for text such as SVG source, its "
        "text; use the artifact_read tool for a widget's PNG preview."
    ),
    mime_type="application/json",
)
def artifact_resource(artifact_id: str) -> str:
    def read():
        artifact = artifact_get(
            user=current_user(), artifact_id=_resource_id(artifact_id)
        )
        doc = artifact_doc(artifact)
        head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_CHARS)
        if head.is_text and not head.missing:
            doc["text"] = head.text
            doc["truncated"] = head.truncated
        return doc

    return json.dumps(_resource_read(read))


@server.resource(
    "pippa://conversation/{conversation_id}",
    name="conversation",
    description="A conversation and the ids of its tasks, oldest first (JSON).",
    mime_type="application/json",
)
def conversation_resource(conversation_id: str) -> str:
    def read():
        conversation = conversation_get_for_user(
            user=current_user(), conversation_id=_resource_id(conversation_id)
        )
        return conversation_doc(conversation)

    return json.dumps(_resource_read(read))


# -- listing and completing the resources ----------------------------------------

# resources/list walks the user's rows kind by kind, newest first in each.
RESOURCE_KINDS = ("task", "conversation", "artifact")


def _owned(kind: str, user):
    model = {"task": Task, "conversation": Conversation, "artifact": Artifact}[kind]
    return model.objects.for_user(user).order_by("-id")


def _listed(kind: str, row) -> Resource:
    """How a row shows in resources/list: its address, title and state in words."""
    if kind == "task":
        words = (
            f"task: {row.get_status_display()}, {row.steps_done} of"
            f" {row.steps_total} steps done (conversation {row.conversation_id})"
        )
    elif kind == "conversation":
        words = "conversation: its tasks' ids (list_tasks for their state)"
    else:
        words = (
            f"artifact: class {row.artifact_class}"
            f" ({ArtifactClass(row.artifact_class).label}), {row.media_type},"
            f" {row.size:,} bytes"
        )
    return Resource(
        uri=uri_of(kind, row.pk),
        name=f"{kind}-{row.pk}",
        title=row.title or f"{kind} {row.pk}",
        description=words,
        mime_type="application/json",
    )


def resources_page(cursor: str | None) -> ListResourcesResult:
    """One page of the user's tasks, then conversations, then artifacts.

    A page holds rows of one kind; the cursor says which kind and the id the
    page starts after. A cursor this list did not give out is an invalid
    parameter (JSON-RPC -32602), as the protocol asks.
    """
    user = current_user()
    kind, after = RESOURCE_KINDS[0], None
    if cursor is not None:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            listing, kind, after = json.loads(raw)
        except (binascii.Error, ValueError, TypeError):
            listing = None
        if (
            listing != "resources"
            or kind not in RESOURCE_KINDS
            or not (after is None or (type(after) is int))
        ):
            raise MCPError(
                code=INVALID_PARAMS,
                message=ERR_CURSOR.format(cursor=cursor[:40], listing="resources/list"),
            )
    kinds = RESOURCE_KINDS[RESOURCE_KINDS.index(kind) :]
    for position, kind in enumerate(kinds):
        rows = _owned(kind, user)
        if after is not None:
            rows = rows.filter(id__lt=after)
        page, more = page_of(rows, PAGE_ROWS)
        after = None
        if not page and position + 1 < len(kinds):
            continue
        if more:
            following = json.dumps(["resources", kind, page[-1].pk])
        elif position + 1 < len(kinds):
            following = json.dumps(["resources", kinds[position + 1], None])
        else:
            following = None
        return ListResourcesResult(
            resources=[_listed(kind, row) for row in page],
            next_cursor=None
            if following is None
            else base64.urlsafe_b64encode(following.encode()).decode().rstrip("="),
        )
    return ListResourcesResult(resources=[])


async def _list_resources(ctx, params: PaginatedRequestParams) -> ListResourcesResult:
    return await in_thread(resources_page, params.cursor)


server._lowlevel_server.add_request_handler(
    "resources/list", PaginatedRequestParams, _list_resources
)

# The template variable each kind's id fills.
TEMPLATE_KINDS = {
    "pippa://task/{task_id}": ("task", "task_id"),
    "pippa://artifact/{artifact_id}": ("artifact", "artifact_id"),
    "pippa://conversation/{conversation_id}": ("conversation", "conversation_id"),
}


def id_completions(kind: str, typed: str) -> Completion:
    """The user's ids of ``kind`` that start with what was typed, newest first."""
    if typed and not typed.isdigit():
        return Completion(values=[], total=0, has_more=False)
    rows = _owned(kind, current_user())
    if typed:
        rows = rows.annotate(id_text=Cast("id", CharField())).filter(
            id_text__startswith=typed
        )
    ids = [str(pk) for pk in rows.values_list("id", flat=True)[: MAX_COMPLETIONS + 1]]
    more = len(ids) > MAX_COMPLETIONS
    return Completion(
        values=ids[:MAX_COMPLETIONS],
        total=rows.count() if more else len(ids),
        has_more=more,
    )


@server.completion()
async def complete(ref, argument, context) -> Completion | None:
    """Complete a resource template's id with the user's own ids (no prompts here)."""
    if not isinstance(ref, ResourceTemplateReference):
        return None
    kind, variable = TEMPLATE_KINDS.get(ref.uri, (None, None))
    if kind is None or argument.name != variable:
        return None
    return await in_thread(id_completions, kind, argument.value[:20])
