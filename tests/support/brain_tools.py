"""A test tool for interrupting a runner mid-step: ``test.gate``.

Class 2 (an idempotent fetch), so a resumed runner may call it again. Its
output depends only on its args. While the file named by ``PIPPA_GATE_HOLD``
exists, the call announces itself in ``PIPPA_GATE_ENTERED`` and waits: the
test kills the runner there, removes the hold file, and resumes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tasks.tools import ToolContext, ToolResult, tool

MAX_HOLD_SECONDS = 60


@tool("test.gate", artifact_class=2, media_type="application/json")
def gate(ctx: ToolContext, *, label: str = "gate") -> ToolResult:
    """Return a fixed document; wait at the gate while the hold file exists."""
    hold = os.environ.get("PIPPA_GATE_HOLD")
    entered = os.environ.get("PIPPA_GATE_ENTERED")
    if hold and Path(hold).exists():
        if entered:
            Path(entered).write_text(
                json.dumps({"pid": os.getpid(), "step": ctx.step_id})
            )
        deadline = time.monotonic() + MAX_HOLD_SECONDS
        while Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    body = {"label": label, "fetched": "2024-06-28"}
    return ToolResult(
        data=json.dumps(body, sort_keys=True).encode(),
        media_type="application/json",
        title=f"Gate {label}",
    )
