"""Four offline demo tools, one per artifact class, on data the project ships.

- ``demo.image`` (class 1): renders a PNG with Pillow to a file.
- ``demo.closes`` (class 2): unadjusted daily closes for a fixed past range,
  from a bundled CSV: the same call gives the same bytes.
- ``demo.search`` (class 3): a "web search" over a bundled corpus whose order
  and timestamps vary per call, like a real search.
- ``demo.chart`` (class 4): an SVG line chart of a class-2 output, naming it
  in ``source_refs``.
- ``demo.notify`` (class 3, outside side effects): appends a note to an outbox
  file, dropping a duplicate with the same idempotency key.

Every tool takes ``pause`` (seconds, capped) so the live demo advances
visibly. When ``PIPPA_TOOL_LOG`` names a file, each call appends one line to
it: the crash tests count real invocations through that side channel.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

from pydantic import Field

from tasks.tools import ToolContext, ToolResult, folder_private, tool

DATA = Path(__file__).resolve().parent / "data"
CLOSES_FILE = DATA / "closes_pipa_2024h1.csv"
CORPUS_FILE = DATA / "corpus.json"
MAX_PAUSE = 30.0

ERR_NO_CLOSES = "no closes for {symbol} between {start} and {end}"

# What a step's args mean, for the schema list_step_tools shows (Tool.args_schema).
Pause = Annotated[
    float,
    Field(
        description=f"seconds to wait before working (the demo's pace), at most {MAX_PAUSE:g}"
    ),
]
Day = Annotated[
    str,
    Field(
        description="a date, YYYY-MM-DD (the bundled data: 2024-01-02 to 2024-06-28)"
    ),
]
ERR_OUTAGE = "the search service is unavailable (simulated outage)"


SIDE_CHANNEL_RECORD = 512


def side_channel_note(ctx: ToolContext, name: str, phase: str) -> None:
    """Append one JSON line about this call to $PIPPA_TOOL_LOG, if set.

    Tests count real tool invocations through it, across processes (O_APPEND).
    Each line is padded to a fixed record (``SIDE_CHANNEL_RECORD`` bytes, a
    divisor of the page size), so no write crosses a page boundary: a SIGKILL
    can cut a write short only between pages, so it never tears a line.
    """
    path = os.environ.get("PIPPA_TOOL_LOG")
    if not path:
        return
    line = json.dumps(
        {
            "tool": name,
            "phase": phase,
            "task": ctx.task_id,
            "step": ctx.step_id,
            "key": ctx.idempotency_key,
            "attempt": ctx.attempt,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    record = line.encode()
    record += b" " * (-(len(record) + 1) % SIDE_CHANNEL_RECORD) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, record)
    finally:
        os.close(fd)


def _pause(seconds: float) -> None:
    if seconds:
        time.sleep(min(float(seconds), MAX_PAUSE))


@tool("demo.image", artifact_class=1, media_type="image/png")
def demo_image(
    ctx: ToolContext,
    *,
    text: Annotated[
        str, Field(description="the card's text (60 characters shown)")
    ] = "Pippa",
    width: Annotated[int, Field(description="pixels, 32 to 1024")] = 320,
    height: Annotated[int, Field(description="pixels, 32 to 1024")] = 160,
    pause: Pause = 0,
) -> ToolResult:
    """Render a title card as a PNG file."""
    from PIL import Image, ImageDraw

    side_channel_note(ctx, "demo.image", "start")
    _pause(pause)
    width, height = max(32, min(int(width), 1024)), max(32, min(int(height), 1024))
    seed = sum(text.encode()) % 360
    image = Image.new("RGB", (width, height), _hsl(seed, 0.45, 0.88))
    draw = ImageDraw.Draw(image)
    draw.rectangle(
        [6, 6, width - 7, height - 7], outline=_hsl(seed, 0.5, 0.35), width=3
    )
    draw.text((18, height // 2 - 8), text[:60], fill=_hsl(seed, 0.6, 0.2))
    out = io.BytesIO()
    image.save(out, format="PNG")
    path = ctx.file_write("image.png", out.getvalue())
    side_channel_note(ctx, "demo.image", "end")
    return ToolResult(
        path=path,
        media_type="image/png",
        title=f"Title card: {text[:80]}",
        meta={"width": width, "height": height},
    )


def _hsl(h: int, s: float, lightness: float) -> tuple[int, int, int]:
    import colorsys

    r, g, b = colorsys.hls_to_rgb(h / 360, lightness, s)
    return round(r * 255), round(g * 255), round(b * 255)


@tool("demo.closes", artifact_class=2, media_type="text/csv")
def demo_closes(
    ctx: ToolContext,
    *,
    symbol: Annotated[
        str, Field(description="the ticker (the bundled data has PIPA)")
    ] = "PIPA",
    start: Day = "2024-01-02",
    end: Day = "2024-06-28",
    pause: Pause = 0,
) -> ToolResult:
    """Fetch unadjusted daily closes for a fixed past range (bundled data)."""
    side_channel_note(ctx, "demo.closes", "start")
    _pause(pause)
    with CLOSES_FILE.open(newline="") as fh:
        rows = [
            r
            for r in csv.DictReader(fh)
            if r["symbol"] == symbol and start <= r["date"] <= end
        ]
    if not rows:
        raise ValueError(ERR_NO_CLOSES.format(symbol=symbol, start=start, end=end))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["date", "close"])
    for r in rows:
        writer.writerow([r["date"], r["close"]])
    side_channel_note(ctx, "demo.closes", "end")
    return ToolResult(
        data=out.getvalue().encode(),
        media_type="text/csv",
        title=f"{symbol} unadjusted closes {start} to {end}",
        meta={"symbol": symbol, "start": start, "end": end, "rows": len(rows)},
    )


@tool("demo.search", artifact_class=3, media_type="application/json")
def demo_search(
    ctx: ToolContext,
    *,
    query: Annotated[
        str, Field(description="words to search the bundled corpus for")
    ] = "PIPA",
    k: Annotated[int, Field(description="how many results, 1 to 20")] = 5,
    pause: Pause = 0,
    fail_until_generation: Annotated[
        int,
        Field(
            description="simulate an outage: fail until the step is retried this many times"
        ),
    ] = 0,
) -> ToolResult:
    """Search the bundled corpus; ranking ties and timestamps vary per call."""
    side_channel_note(ctx, "demo.search", "start")
    _pause(pause)
    if ctx.generation < int(fail_until_generation):
        raise ConnectionError(ERR_OUTAGE)
    docs = json.loads(CORPUS_FILE.read_text())
    terms = {t for t in query.lower().split() if t}
    rng = random.Random()
    scored = []
    for doc in docs:
        words = (doc["title"] + " " + doc["text"]).lower()
        score = sum(words.count(t) for t in terms)
        if score:
            # Freshness noise: a live search ranks differently each time.
            scored.append((score + rng.random() * 1.5, doc))
    scored.sort(key=lambda pair: pair[0], reverse=True)
    now = datetime.now(UTC)
    results = [
        {
            "rank": i + 1,
            "title": doc["title"],
            "url": doc["url"],
            "snippet": doc["text"][:160],
            "seen_at": (now - timedelta(minutes=rng.randint(0, 600))).isoformat(),
        }
        for i, (_, doc) in enumerate(scored[: max(1, min(int(k), 20))])
    ]
    body = {"query": query, "searched_at": now.isoformat(), "results": results}
    side_channel_note(ctx, "demo.search", "end")
    return ToolResult(
        data=json.dumps(body, indent=1).encode(),
        media_type="application/json",
        title=f"Search: {query[:80]}",
        meta={"query": query[:200], "results": len(results)},
    )


@tool("demo.chart", artifact_class=4, media_type="image/svg+xml")
def demo_chart(
    ctx: ToolContext,
    *,
    source: Annotated[
        int,
        Field(
            description="the position (1, 2, ...) of an earlier step of this task"
            " whose output is demo.closes' CSV: the chart draws it"
        ),
    ] = 2,
    title: Annotated[str, Field(description="the chart's title")] = "Daily closes",
    pause: Pause = 0,
) -> ToolResult:
    """Draw an SVG line chart of a class-2 closes output (an earlier step)."""
    side_channel_note(ctx, "demo.chart", "start")
    _pause(pause)
    artifact = ctx.output(int(source))
    rows = list(csv.DictReader(io.StringIO(ctx.read(int(source)).decode())))
    closes = [float(r["close"]) for r in rows]
    width, height, pad = 480, 200, 24
    low, high = min(closes), max(closes)
    span = (high - low) or 1.0
    step_x = (width - 2 * pad) / max(1, len(closes) - 1)
    points = " ".join(
        f"{pad + i * step_x:.1f},{height - pad - (c - low) / span * (height - 2 * pad):.1f}"
        for i, c in enumerate(closes)
    )
    label = _xml_escape(title[:80])
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="#fbfaf7"/>'
        f'<text x="{pad}" y="16" font-family="sans-serif" font-size="12">{label}</text>'
        f'<polyline fill="none" stroke="#2f6f8f" stroke-width="1.5" points="{points}"/>'
        f'<text x="{pad}" y="{height - 6}" font-family="sans-serif" font-size="10">'
        f"{rows[0]['date']} to {rows[-1]['date']}: {low:.2f}-{high:.2f}</text>"
        "</svg>"
    )
    side_channel_note(ctx, "demo.chart", "end")
    return ToolResult(
        data=svg.encode(),
        media_type="image/svg+xml",
        title=title[:200],
        meta={"points": len(closes)},
        source_ids=[artifact.pk],
    )


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@tool(
    "demo.notify",
    artifact_class=3,
    side_effects=True,
    media_type="application/json",
)
def demo_notify(
    ctx: ToolContext,
    *,
    to: Annotated[str, Field(description="who the note is for")] = "dad",
    message: Annotated[str, Field(description="the note (500 characters kept)")] = "",
    pause: Pause = 0,
) -> ToolResult:
    """Send a note to an outbox file; a repeated idempotency key is dropped there."""
    side_channel_note(ctx, "demo.notify", "start")
    _pause(pause)
    outbox = folder_private(ctx.files_root) / "outbox.jsonl"
    seen = set()
    if outbox.exists():
        seen = {
            json.loads(line)["key"] for line in outbox.read_text().splitlines() if line
        }
    duplicate = ctx.idempotency_key in seen
    if not duplicate:
        fd = os.open(outbox, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(
                json.dumps(
                    {"key": ctx.idempotency_key, "to": to, "message": message[:500]}
                )
                + "\n"
            )
    receipt = {"to": to, "key": ctx.idempotency_key, "duplicate_dropped": duplicate}
    side_channel_note(ctx, "demo.notify", "end")
    return ToolResult(
        data=json.dumps(receipt).encode(),
        media_type="application/json",
        title=f"Note to {to}",
        meta={"duplicate_dropped": duplicate},
    )
