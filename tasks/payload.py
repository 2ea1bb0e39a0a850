"""A step's payload: what the tool handed back, checked, and written as a file.

``tool_output`` checks the tool's answer (bytes, or a class-1 file under the
files folder; a bad answer is the tool's failure). ``payload_write`` writes
it as a content-addressed file (a file with no name, linked under its sha,
then the file and its folder fsynced: ``artifacts.store``), after the owner's
quota admits it, and returns the ``payload_persisted`` event's data: the
executor records it in commit 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.models import ArtifactClass
from artifacts.quota import quota_admit
from artifacts.services import MAX_SOURCES, sources_check
from artifacts.store import default_store
from pippa_site.text import TITLE_MAX, media_type_clean
from tasks.crashpoints import crashpoint
from tasks.statements import StepRow
from tasks.tools import ToolResult

ERR_NO_OUTPUT = "the tool returned no payload"
ERR_FILE_OUTSIDE = "a class-1 tool must write its file under the files folder"

MAX_PAYLOAD_META_CHARS = 1500


@dataclass
class Output:
    """What the tool handed back, checked: bytes, or a class-1 file under the root."""

    result: ToolResult
    data: bytes | None = None
    path: Path | None = None
    rel_path: str | None = None
    size: int = 0


def tool_output(row: StepRow, result: Any, root: Path) -> Output:
    """Check what the tool returned; a bad answer is the tool's failure."""
    if isinstance(result, (bytes, bytearray, str)):
        result = ToolResult(
            data=result.encode() if isinstance(result, str) else bytes(result)
        )
    if not isinstance(result, ToolResult):
        raise TypeError("a tool must return a ToolResult, bytes or str")
    if result.source_ids:
        # Lineage joins only the owner's rows: a source that is not one of
        # them is refused like an unknown id, before anything is stored.
        result.source_ids = sources_check(
            owner_id=row.owner_id, source_ids=list(result.source_ids)[:MAX_SOURCES]
        )
    if row.artifact_class == ArtifactClass.FILE and result.path is not None:
        path = Path(result.path)
        if not path.is_absolute():
            path = root / f"t{row.task_id}" / f"s{row.id}-g{row.generation}" / path
        path = path.resolve()
        if not path.is_relative_to(root.resolve()):
            raise ValueError(ERR_FILE_OUTSIDE)
        return Output(
            result,
            path=path,
            rel_path=str(path.relative_to(root.resolve())),
            size=path.stat().st_size,  # a missing file is the tool's failure
        )
    if result.data is None:
        raise ValueError(ERR_NO_OUTPUT)
    return Output(result, data=result.data, size=len(result.data))


def payload_write(row: StepRow, default_media: str, output: Output) -> dict[str, Any]:
    """Write the payload file (durably) and return the ``payload_persisted`` data."""
    crashpoint("after_tool")
    result = output.result
    store = default_store()
    admit = quota_admit(row.owner_id)  # refused: nothing stored, output unsaved
    if output.path is not None:
        with output.path.open("rb") as fh:
            put = store.put_file(fh, admit=admit)
    else:
        put = store.put_bytes(output.data, admit=admit)
    meta = dict(result.meta or {})
    if len(json.dumps(meta, default=str)) > MAX_PAYLOAD_META_CHARS:
        meta = {"meta_dropped": "too large for the event log"}
    payload: dict[str, Any] = {
        "sha": put.sha256,
        "size": put.size,
        # What the artifact's row will say (a tool's type that is not one
        # is application/octet-stream there too).
        "media_type": media_type_clean(result.media_type or default_media),
        "title": (result.title or row.title)[:TITLE_MAX],
        "meta": meta,
        "attempt": row.attempts,
        "generation": row.generation,
        "key": row.key,
    }
    if output.rel_path:
        payload["path"] = output.rel_path
    if result.source_ids:
        payload["source_ids"] = [int(x) for x in result.source_ids]
    return payload
