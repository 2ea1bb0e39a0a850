"""MCP tools that read and store artifacts (refs in, refs out)."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Literal

from django.conf import settings
from django.template.defaultfilters import filesizeformat
from mcp.server.mcpserver.exceptions import (
    ToolError,
)
from mcp.types import (
    CallToolResult,
    ImageContent,
    TextContent,
)
from pydantic import Field

from artifacts.preview import preview_artifact_for, preview_status
from artifacts.selectors import artifact_text_head
from artifacts.services import MAX_SOURCES
from artifacts.store import BlobError, default_store
from pippa_mcp.answers import MAX_SOURCE_CHARS, artifact_doc, content_bytes
from pippa_mcp.arguments import (
    MAX_STORE_BYTES,
    SHA256_CHARS,
    ArtifactClassValue,
    Id,
)
from pippa_mcp.door import current_user, tool
from pippa_mcp.shapes import (
    ArtifactReadOut,
    PreviewRef,
    StoredArtifact,
)
from pippa_site.text import media_type_check
from tasks.documents import (
    artifact_get,
    artifacts_get,
    task_get_for_user,
)
from tasks.services import task_artifact_upload
from tasks.shapes import (
    MediaType,
    TitleOrEmpty,
)

ERR_SHA_MISMATCH = "artifact {id} has sha256 {actual}, not {expected}: the ref you hold names other bytes"
ERR_BLOB_MISSING = "artifact {id} has lost its payload (the blob is missing)"
ERR_BINARY = (
    "artifact {id} is {media_type}, which is not text: ask for view='preview' if it"
    " is a widget, or download it over the JSON API"
)
ERR_NO_PREVIEW = "artifact {id} has no PNG preview{reason}"
ERR_EMPTY = "content is empty: send the artifact's text (or base64 bytes)"
ERR_TOO_LARGE = (
    "content is {size:,} bytes, more than the {limit:,} this tool takes; upload a"
    " payload that big over the JSON API (POST /api/v1/tasks/{id}/artifacts, with"
    " an API token from /settings/tokens/: it streams up to {upload_limit})"
)
ALREADY_STORED = (
    "these bytes were already stored as artifact {id} (class {artifact_class},"
    " {media_type}, “{title}”): that row is kept as it is, and only this task's"
    " link and any new source_refs were added"
)


# -- artifacts -----------------------------------------------------------------------


@tool(title="Read an artifact", read_only=True)
def artifact_read(
    artifact_id: Id,
    view: Literal["auto", "source", "preview"] = "auto",
    sha256: Annotated[str, Field(max_length=SHA256_CHARS)] = "",
) -> Annotated[CallToolResult, ArtifactReadOut]:
    """Read an artifact by its ref: its source as text, or its PNG preview as an image.

    view='source' gives an SVG widget's markup or a text payload (capped at
    256 KiB); view='preview' gives the widget's rendered PNG as image content,
    to look at instead of parsing markup; 'auto' picks source for text and
    the image for PNGs. Pass the sha256 from the ref to make sure you read
    the bytes it names. Reading is read-only: no lease, no state change.
    The first content block is the artifact's metadata as JSON (the
    structured answer); the second is the text or the image.
    """
    artifact = artifact_get(user=current_user(), artifact_id=artifact_id)
    if sha256 and sha256.lower() != artifact.sha256:
        raise ToolError(
            ERR_SHA_MISMATCH.format(
                id=artifact.pk, actual=artifact.sha256, expected=sha256
            )
        )
    meta = artifact_doc(artifact)
    is_png = artifact.media_type == "image/png"
    if view == "auto":
        view = "preview" if is_png else "source"
    if view == "preview":
        image = preview_artifact_for(artifact)
        if image is None:
            why = preview_status(artifact).get("reason") or ""
            raise ToolError(
                ERR_NO_PREVIEW.format(id=artifact.pk, reason=f" ({why})" if why else "")
            )
        try:
            png = default_store().get(image.sha256)
        except BlobError:
            raise ToolError(ERR_BLOB_MISSING.format(id=image.pk)) from None
        read = ArtifactReadOut(
            artifact=meta,
            view="preview",
            preview=PreviewRef(id=image.pk, sha256=image.sha256),
        )
        return _read_answer(
            read,
            ImageContent(
                type="image",
                data=base64.b64encode(png).decode("ascii"),
                mime_type="image/png",
            ),
        )
    head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_CHARS)
    if not head.is_text:
        raise ToolError(
            ERR_BINARY.format(id=artifact.pk, media_type=artifact.media_type)
        )
    if head.missing:
        raise ToolError(ERR_BLOB_MISSING.format(id=artifact.pk))
    read = ArtifactReadOut(artifact=meta, view="source", truncated=head.truncated)
    return _read_answer(read, TextContent(type="text", text=head.text))


def _read_answer(read: ArtifactReadOut, content) -> CallToolResult:
    """The metadata as structured content (and as JSON text first), then the content."""
    doc = read.model_dump(mode="json")
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(doc)), content],
        structured_content=doc,
    )


@tool(title="Store an artifact of a task", idempotent=True)
def artifact_store(
    task_id: Id,
    content: Annotated[str, Field(max_length=2 * MAX_STORE_BYTES)],
    artifact_class: ArtifactClassValue,
    media_type: MediaType = "text/plain",
    title: TitleOrEmpty = "",
    source_refs: Annotated[list[Id], Field(max_length=MAX_SOURCES)] = [],  # noqa: B006
    step_id: Id | None = None,
    encoding: Literal["text", "base64"] = "text",
) -> StoredArtifact:
    """Store a small artifact (up to 1 MiB) that this task persisted; return its ref.

    The bytes are written to the content-addressed store before the row
    that names them (write before show). Bytes you already stored are one
    artifact: the answer then says already_stored=true, and its class,
    title and media type are the earlier row's, which stand. Choose
    artifact_class by how it behaves on resume: 1 file, 2 fetch (can be
    fetched again), 3 snapshot (cannot be reproduced: a search, a live
    quote), 4 render (derived from other artifacts: name them in
    source_refs, so lineage keeps them alive). media_type is type/subtype,
    e.g. text/markdown or image/svg+xml.
    """
    user = current_user()
    media_type_check(media_type, field="media_type")
    task = task_get_for_user(user=user, task_id=task_id)
    data = content_bytes(content, encoding)
    if not data:
        raise ToolError(ERR_EMPTY)
    if len(data) > MAX_STORE_BYTES:
        raise ToolError(
            ERR_TOO_LARGE.format(
                size=len(data),
                limit=MAX_STORE_BYTES,
                id=task.pk,
                upload_limit=filesizeformat(settings.PIPPA_MAX_UPLOAD_BYTES),
            )
        )
    sources = artifacts_get(user=user, artifact_ids=source_refs)
    artifact = task_artifact_upload(
        task=task,
        step_id=step_id,
        stream=iter([data]),
        media_type=media_type,
        artifact_class=artifact_class,
        title=title,
        source_ids=[s.pk for s in sources],
        max_bytes=MAX_STORE_BYTES,
    )
    already = not getattr(artifact, "_created", True)
    note = None
    if already:
        note = ALREADY_STORED.format(
            id=artifact.pk,
            artifact_class=artifact.artifact_class,
            media_type=artifact.media_type,
            title=artifact.title,
        )
    return StoredArtifact(**artifact_doc(artifact), already_stored=already, note=note)
