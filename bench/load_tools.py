"""``PIPPA_TOOLS=bench.load_tools``: the load run's tools, for real workers.

``bench.payload`` is the executor bench's 1 KiB payload tool, which costs
nothing; ``bench.paced`` returns the same payload after waiting
``PACED_SECONDS``, as a step that waits on a brain's answer does.
"""

from __future__ import annotations

import time

from bench.bench_executor import _bench_tool, tool_setup
from tasks.tools import tool_register

PACED_SECONDS = 0.02


def _paced_tool(ctx, **kwargs):
    time.sleep(PACED_SECONDS)
    return _bench_tool(ctx, **kwargs)


def load_tools_setup() -> None:
    tool_setup()
    tool_register("bench.paced", _paced_tool, artifact_class=2, media_type="text/plain")


load_tools_setup()
