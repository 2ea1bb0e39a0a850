"""Artifact pages and payload endpoints. Every one is login-required and owner-checked.

Payloads are untrusted (model output, fetched pages). The source endpoint
serves raw bytes with ``Content-Security-Policy: sandbox`` and ``nosniff``, and
as a download for anything a browser would render as a document (SVG, HTML,
XML). Pages never inline payload markup: previews are ``<img>`` PNGs and the
source view is escaped text.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST, require_safe

from artifacts.caching import immutable, not_modified
from artifacts.lineage_graph import lineage_graph
from artifacts.models import Artifact
from artifacts.preview import preview_artifact_for, preview_sha_for, preview_status
from artifacts.selectors import (
    TEXT_MEDIA_PREFIXES,
    artifact_get_for_user,
    artifact_home,
    artifact_lineage,
    artifact_owners,
    artifact_text_head,
    search_headlines,
)
from artifacts.services import artifact_verify
from artifacts.store import BlobError, default_store
from pippa_site.errors import NotFound
from pippa_site.login import login_required
from pippa_site.owners import staff_reads
from pippa_site.streaming import file_streamed

# The raw payload may be a document with script; give it no powers at all.
SOURCE_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
# Rendered inline only when a browser cannot run anything in them.
INLINE_MEDIA_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "text/plain", "application/json"}
)
MAX_SOURCE_TEXT_BYTES = 256 * 1024

ERR_NO_PREVIEW = "This artifact has no preview."
ERR_BLOB_MISSING = "The payload of this artifact is missing from the blob store."
MSG_VERIFIED = {
    Artifact.Integrity.OK: "Verified: the blob matches its sha256.",
    Artifact.Integrity.MISSING: "The blob is missing.",
    Artifact.Integrity.CORRUPT: "The blob does not match its sha256 (corrupt).",
}


def _payload_response(
    request: HttpRequest, artifact: Artifact, *, download: bool
) -> FileResponse:
    try:
        fh = default_store().open(artifact.sha256)
    except BlobError:
        raise NotFound(ERR_BLOB_MISSING) from None
    response = FileResponse(
        fh,
        content_type=artifact.media_type,
        as_attachment=download,
        filename=_filename(artifact),
    )
    if not response.has_header("Content-Length"):  # a bucket's stream
        response["Content-Length"] = str(artifact.size)
    response["Content-Security-Policy"] = SOURCE_CSP
    response["X-Content-Type-Options"] = "nosniff"
    response["Cross-Origin-Resource-Policy"] = "same-origin"
    # Content-addressed: the bytes behind this URL never change.
    return immutable(file_streamed(request, response), sha256=artifact.sha256)


def _filename(artifact: Artifact) -> str:
    extension = {
        "image/svg+xml": "svg",
        "text/html": "html",
        "image/png": "png",
        "application/json": "json",
        "text/plain": "txt",
        "text/csv": "csv",
    }.get(artifact.media_type, "bin")
    return f"artifact-{artifact.pk}-{artifact.sha256[:12]}.{extension}"


@require_safe
@login_required
def artifact_source(request: HttpRequest, artifact_id: int) -> HttpResponse:
    artifact = artifact_get_for_user(
        user=request.user, artifact_id=artifact_id, staff=staff_reads(request)
    )
    cached = not_modified(request, sha256=artifact.sha256)
    if cached is not None:
        return cached
    download = artifact.media_type not in INLINE_MEDIA_TYPES
    return _payload_response(request, artifact, download=download)


@require_safe
@login_required
def artifact_preview(request: HttpRequest, artifact_id: int) -> HttpResponse:
    artifact = artifact_get_for_user(
        user=request.user, artifact_id=artifact_id, staff=staff_reads(request)
    )
    # A repeat view is answered from the widget's own row: no preview row, no blob.
    sha = preview_sha_for(artifact)
    cached = not_modified(request, sha256=sha) if sha else None
    if cached is not None:
        return cached
    preview = preview_artifact_for(artifact)
    if preview is None:
        raise NotFound(ERR_NO_PREVIEW)
    return _payload_response(request, preview, download=False)


@require_GET
@login_required
def artifact_source_text(request: HttpRequest, artifact_id: int) -> HttpResponse:
    """The payload as escaped text (SVG/HTML source), capped, never as markup."""
    artifact = artifact_get_for_user(
        user=request.user, artifact_id=artifact_id, staff=staff_reads(request)
    )
    head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_TEXT_BYTES)
    error = ""
    if not head.is_text:
        error = "This artifact is binary; download it instead."
    elif head.missing:
        error = ERR_BLOB_MISSING
    text, truncated = head.text, head.truncated
    return render(
        request,
        "artifacts/source_text.html",
        {
            "artifact": artifact,
            "crumb_parent": artifact_home(artifact=artifact, user=request.user),
            "text": text,
            "truncated": truncated,
            "error": error,
            "limit_kib": MAX_SOURCE_TEXT_BYTES // 1024,
        },
    )


@require_GET
@login_required
def artifact_detail(request: HttpRequest, artifact_id: int) -> HttpResponse:
    staff = staff_reads(request)
    artifact = artifact_get_for_user(
        user=request.user, artifact_id=artifact_id, staff=staff
    )
    owners = artifact_owners(artifact=artifact, user=request.user, staff=staff)
    lineage = artifact_lineage(artifact=artifact, user=request.user)
    media = artifact.media_type.split(";")[0].strip().lower()
    is_data = media == "application/json" or media.endswith("+json")
    return render(
        request,
        "artifacts/detail.html",
        {
            "artifact": artifact,
            "crumb_parent": artifact_home(
                artifact=artifact, user=request.user, owners=owners
            ),
            "preview": preview_artifact_for(artifact),
            "preview_state": preview_status(artifact),
            "lineage": lineage,
            "lineage_graph": lineage_graph(artifact=artifact, lineage=lineage),
            "owners": owners,
            "is_text": artifact.media_type.startswith(TEXT_MEDIA_PREFIXES),
            # Data for programs (JSON) is not shown as code first: a saved
            # search as its headlines, anything else under the engineer's fold.
            "is_data": is_data,
            "headlines": search_headlines(
                sha256=artifact.sha256, media_type=artifact.media_type
            )
            if is_data
            else [],
            "excerpt": _head_text(artifact)
            if artifact.media_type.startswith(TEXT_MEDIA_PREFIXES)
            else None,
        },
    )


# How much of a text artifact its page shows first, above its details.
HEAD_BYTES = 4096


def _head_text(artifact: Artifact) -> tuple[str, bool] | None:
    """The start of a text artifact (text, cut short?), or None when unreadable."""
    try:
        head = default_store().head(artifact.sha256, HEAD_BYTES + 1)
    except (BlobError, OSError):
        return None
    return head[:HEAD_BYTES].decode("utf-8", errors="replace"), len(head) > HEAD_BYTES


@require_POST
@login_required
def artifact_verify_view(request: HttpRequest, artifact_id: int) -> HttpResponse:
    artifact = artifact_get_for_user(user=request.user, artifact_id=artifact_id)
    integrity = artifact_verify(artifact=artifact)
    level = messages.SUCCESS if integrity == Artifact.Integrity.OK else messages.ERROR
    messages.add_message(request, level, MSG_VERIFIED[integrity])
    return redirect("artifacts:detail", artifact_id=artifact.pk)
