"""Small display filters for the dashboard templates."""

from __future__ import annotations

import json
from datetime import timedelta

from django import template

register = template.Library()

MAX_DATA_CHARS = 300


@register.filter
def compact_json(value: object) -> str:
    """Return event data as one line of JSON, cut to a readable length."""
    text = json.dumps(value, default=str, separators=(", ", ": "))
    if len(text) > MAX_DATA_CHARS:
        return text[: MAX_DATA_CHARS - 1] + "…"
    return text


@register.filter
def duration(value: timedelta | None) -> str:
    """Return a timedelta as "850 ms", "12.3 s", "4 min 5 s" or "2 h 3 min"."""
    if value is None:
        return ""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@register.filter
def humanize_key(value: str) -> str:
    return str(value).replace("_", " ")


@register.filter
def from_now(value) -> str:
    """Return "in 45 s", "in 3 min", "5 min ago" or "just now", relative to now."""
    from django.utils import timezone

    if value is None:
        return ""
    delta = (value - timezone.now()).total_seconds()
    if abs(delta) < 1:
        return "just now"
    ahead = delta > 0
    seconds = int(abs(delta))
    if seconds < 60:
        text = f"{seconds} s"
    elif seconds < 3600:
        text = f"{seconds // 60} min"
    else:
        text = f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"in {text}" if ahead else f"{text} ago"
