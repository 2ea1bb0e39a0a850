"""``PIPPA_TOOLS=bench.load_tools``: the bench's 1 KiB payload tool, for real workers."""

from __future__ import annotations

from bench.bench_executor import tool_setup

tool_setup()
