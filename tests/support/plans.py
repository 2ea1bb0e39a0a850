"""Plans more than one test module runs, each stated once."""

from __future__ import annotations

# One step of each of the four artifact classes, with the demo's tools.
DEMO_PLAN = [
    {"title": "Title card", "tool": "demo.image", "args": {"text": "PIPA"}},
    {"title": "Closes", "tool": "demo.closes", "args": {}},
    {"title": "Search", "tool": "demo.search", "args": {"query": "PIPA dividend"}},
    {"title": "Chart", "tool": "demo.chart", "args": {"source": 2}},
]

# Fetch a month of closes, then chart them: the JSON API's two-step plan.
CLOSES_CHART_PLAN = [
    {"title": "Fetch closes", "tool": "demo.closes", "args": {"end": "2024-01-31"}},
    {"title": "Chart them", "tool": "demo.chart", "args": {"source": 1}},
]
