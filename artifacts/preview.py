"""PNG previews of widget artifacts (SVG, or HTML with an SVG inside).

The widget is untrusted model output. It is rendered only in a subprocess
(``artifacts/render_worker.py``) that caps its own memory, CPU time and file
writes, refuses to open files, sockets or processes once it holds the input,
and is killed by the wall-clock timeout here. Every failure is closed: the
widget stays stored, and its ``meta["preview"]`` records
``{"status": "failed", "reason": …}`` for the page to show.

``meta["preview"]`` on the widget is the one place preview state lives:
``{"status": "ok", "artifact_id": N, "sha256": …}`` or
``{"status": "failed", "reason": "…"}``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from artifacts.models import Artifact, ArtifactClass
from artifacts.quota import QuotaExceeded
from artifacts.services import (
    BlobVanished,
    artifact_record,
    blob_put,
    blob_put_refused,
)
from artifacts.store import BlobError, default_store

log = logging.getLogger("pippa.preview")

WORKER = Path(__file__).resolve().parent / "render_worker.py"
WIDGET_MEDIA_TYPES = frozenset({"image/svg+xml", "text/html"})
PREVIEW_MEDIA_TYPE = "image/png"

MAX_INPUT_BYTES = 512 * 1024
# The CPU cap (in CAPS) bounds the work; the wall clock, a little longer so a
# busy machine does not fail honest widgets, bounds everything else.
WALL_SECONDS = 8.0
CAPS = {
    "max_input_bytes": MAX_INPUT_BYTES,
    "memory_bytes": 768 * 1024 * 1024,
    "cpu_seconds": 4,
    "max_elements": 5000,
    "max_depth": 64,
    "max_uses": 200,
    "max_expanded": 20000,
    "max_declared_px": 8192,
    "render_side": 960,
    "thumb_side": 640,
    "max_output_pixels": 2_000_000,
}

STATUS_OK = "ok"
STATUS_FAILED = "failed"

REASON_EMPTY = "empty widget: nothing to render"
REASON_TOO_LARGE = f"widget is larger than the {MAX_INPUT_BYTES // 1024} KiB render cap"
REASON_TIMEOUT = f"render ran past its {WALL_SECONDS:g} s time cap"
REASON_CPU = "render ran past its CPU time cap"
REASON_KILLED = "render was killed (memory or time cap)"
REASON_MEMORY = "render ran out of its memory cap"
REASON_NO_OUTPUT = "renderer produced no image"
REASON_BLOB_MISSING = "widget blob is missing"
REASON_NOT_A_WIDGET = "not a widget (SVG or HTML)"
REASON_WORKER = "renderer failed"


@dataclass(frozen=True)
class RenderResult:
    png: bytes | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.png is not None


def _child_env() -> dict[str, str]:
    # Nothing from our environment (no DATABASE_URL, no SECRET_KEY).
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent"}


def render_png(*, data: bytes, media_type: str) -> RenderResult:
    """Render widget bytes to a PNG thumbnail in the capped subprocess.

    Never raises for bad input; the result carries the PNG or a short reason.
    """
    if not data:
        return RenderResult(None, REASON_EMPTY)
    if len(data) > MAX_INPUT_BYTES:
        return RenderResult(None, REASON_TOO_LARGE)
    if media_type not in WIDGET_MEDIA_TYPES:
        return RenderResult(None, REASON_NOT_A_WIDGET)
    caps = {**CAPS, "media_type": media_type}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER), json.dumps(caps)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(),
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        log.exception("could not start the render worker")
        return RenderResult(None, REASON_WORKER)
    try:
        out, err = proc.communicate(data, timeout=WALL_SECONDS)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return RenderResult(None, REASON_TIMEOUT)
    code = proc.returncode
    message = err.decode("utf-8", "replace").strip().splitlines()
    last = message[-1][:200] if message else ""
    if code == 0:
        if not out.startswith(b"\x89PNG\r\n\x1a\n"):
            return RenderResult(None, REASON_NO_OUTPUT)
        return RenderResult(out)
    if code == -signal.SIGXCPU:
        return RenderResult(None, REASON_CPU)
    if code < 0:
        return RenderResult(None, REASON_KILLED)
    if code in (3, 4) and last:
        return RenderResult(None, last)
    if "MemoryError" in err.decode("utf-8", "replace"):
        return RenderResult(None, REASON_MEMORY)
    log.warning("render worker exited %s: %s", code, last)
    return RenderResult(None, REASON_WORKER)


def preview_status(artifact: Artifact) -> dict:
    """Return the widget's preview record ({} when none was attempted)."""
    value = (artifact.meta or {}).get("preview")
    return value if isinstance(value, dict) else {}


def _record(artifact: Artifact, preview: dict) -> None:
    # Re-read meta inside the write so another key set meanwhile survives.
    with transaction.atomic():
        meta = (
            Artifact.objects.select_for_update()
            .values_list("meta", flat=True)
            .get(pk=artifact.pk)
        ) or {}
        meta = {**meta, "preview": preview}
        Artifact.objects.filter(pk=artifact.pk).update(meta=meta)
    artifact.meta = meta


def preview_render(
    *, artifact: Artifact, keep: Callable[[Artifact], None] | None = None
) -> Artifact | None:
    """Render (or reuse) the PNG preview of a widget artifact; fail closed.

    1. Not a widget: return None and record nothing.
    2. A preview already recorded and still intact: return it (idempotent;
       content addressing makes the same widget the same row). One whose
       blob is missing or damaged is rendered again. Only a preview of the
       widget's owner counts.
    3. Read the widget blob; render it in the capped subprocess.
    4. On success write the PNG file, then in ONE transaction the PNG's
       class-4 artifact row (``source_refs`` names the widget), the widget's
       ``status: ok`` record and the caller's keeper (``keep(preview)``, a
       task's link, say): a crash leaves all three or none, never a widget
       naming a row that nothing keeps (which the doctor would sweep).
    5. On any failure record ``status: failed`` with the reason; return None.
    """
    if artifact.media_type not in WIDGET_MEDIA_TYPES:
        return None
    current = preview_status(artifact)
    if current.get("status") == STATUS_OK:
        existing = Artifact.objects.filter(
            pk=current.get("artifact_id"), owner_id=artifact.owner_id
        ).first()
        if existing is not None and default_store().verify(existing.sha256):
            if keep is not None:
                with transaction.atomic():
                    keep(existing)
            return existing
        # A recorded preview whose PNG is gone or damaged is rendered again;
        # content addressing puts the same bytes back under the same row.
    try:
        data = default_store().get(artifact.sha256)
    except BlobError:
        _record(artifact, {"status": STATUS_FAILED, "reason": REASON_BLOB_MISSING})
        return None
    result = render_png(data=data, media_type=artifact.media_type)
    if not result.ok:
        _record(artifact, {"status": STATUS_FAILED, "reason": result.reason})
        return None
    title = f"Preview of {artifact.title}" if artifact.title else "Widget preview"
    try:
        # The file first (write before show), within the owner's quota.
        put = blob_put(data=result.png, owner_id=artifact.owner_id)
    except QuotaExceeded as exc:
        _record(artifact, {"status": STATUS_FAILED, "reason": str(exc)})
        return None
    for last in (False, True):
        try:
            with transaction.atomic():
                # The widget's owner owns its preview: the same PNG from
                # another owner's look-alike widget is that owner's own row
                # over the same blob.
                preview = artifact_record(
                    owner=artifact.owner_id,
                    put=put,
                    media_type=PREVIEW_MEDIA_TYPE,
                    artifact_class=ArtifactClass.RENDER,
                    title=title,
                    meta={"preview_of": artifact.pk},
                    source_ids=[artifact.pk],
                )
                _record(
                    artifact,
                    {
                        "status": STATUS_OK,
                        "artifact_id": preview.pk,
                        "sha256": preview.sha256,
                    },
                )
                if keep is not None:
                    keep(preview)
            return preview
        except QuotaExceeded as exc:  # another write got in first
            blob_put_refused(sha256=put.sha256)
            _record(artifact, {"status": STATUS_FAILED, "reason": str(exc)})
            return None
        except BlobVanished:
            if last:
                raise
            # Collected meanwhile: write it again.
            put = blob_put(data=result.png, owner_id=artifact.owner_id)
    return None


def preview_sha_for(artifact: Artifact) -> str | None:
    """Return the sha256 of the PNG ``preview_artifact_for`` shows, without a query."""
    if artifact.media_type == PREVIEW_MEDIA_TYPE:
        return artifact.sha256
    status = preview_status(artifact)
    if status.get("status") != STATUS_OK:
        return None
    return status.get("sha256") or None


def preview_artifact_for(artifact: Artifact) -> Artifact | None:
    """Return the PNG to show for ``artifact``: itself if a PNG, else its preview."""
    if artifact.media_type == PREVIEW_MEDIA_TYPE:
        return artifact
    status = preview_status(artifact)
    if status.get("status") != STATUS_OK:
        return None
    return Artifact.objects.filter(
        pk=status.get("artifact_id"), owner_id=artifact.owner_id
    ).first()
