"""Small display filters for the dashboard templates."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html

from artifacts.models import Artifact
from council.models import CouncilRound, Turn
from tasks.models import Conversation, Task
from tasks.words import relative_text

register = template.Library()

ABSOLUTE_FORMAT = "D j M Y, H:i:s T"


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
def milliseconds(value: timedelta | None) -> int:
    """A timedelta in whole milliseconds (for a script that keeps counting)."""
    return round(value.total_seconds() * 1000) if value is not None else 0


def absolute_text(value: datetime) -> str:
    """Return the full local time, e.g. "Thu 12 Mar 2026, 14:03:22 UTC"."""
    return date_format(timezone.localtime(value), ABSOLUTE_FORMAT)


@register.filter
def from_now(value: datetime | None) -> str:
    """Return "in 45 s", "in 3 min", "5 min ago" or "just now", relative to now."""
    if value is None:
        return ""
    return relative_text(value)


@register.filter
def when(value: datetime | None) -> str:
    """The site's one date format: relative words, the absolute time on hover.

    ``<time datetime="2026-03-12T14:03:22+00:00" title="Thu 12 Mar 2026,
    14:03:22 UTC">5 min ago</time>``; an empty string for None.
    """
    if value is None:
        return ""
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        absolute_text(value),
        relative_text(value),
    )


@register.filter
def ago(value: datetime | None) -> str:
    """``when`` for a time that a live page keeps counting from.

    ``<time class="ago" ...>9 s ago</time>``: static/js/timeline.js moves its
    words on every few seconds, so a page that has nothing new to fetch still
    says how long ago it was.
    """
    if value is None:
        return ""
    return format_html(
        '<time class="ago" datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        absolute_text(value),
        relative_text(value),
    )


Crumb = tuple[str, str]
# Pages that are not an object, by URL name: {% breadcrumbs "tokens:list" %}.
PAGE_LABELS = {"tokens:list": "API tokens"}


def crumb_trail(obj: object | None) -> list[Crumb]:
    """Return ``[(label, url), ...]`` from the conversation list down to ``obj``."""
    if obj is None:
        return [("Conversations", reverse("dashboard:conversations"))]
    if isinstance(obj, str):
        return [*crumb_trail(None), (PAGE_LABELS[obj], reverse(obj))]
    if isinstance(obj, Conversation):
        return [*crumb_trail(None), (obj.title, obj.get_absolute_url())]
    if isinstance(obj, Task):
        return [*crumb_trail(obj.conversation), (obj.title, obj.get_absolute_url())]
    if isinstance(obj, CouncilRound):
        return [*crumb_trail(obj.conversation), (str(obj), obj.get_absolute_url())]
    if isinstance(obj, Turn):
        label = f"Turn {obj.order} by {obj.participant.name}"
        url = f"{obj.round.get_absolute_url()}#turn-{obj.order}"
        return [*crumb_trail(obj.round), (label, url)]
    if isinstance(obj, Artifact):
        return [(obj.title or f"Artifact {obj.pk}", obj.get_absolute_url())]
    raise TypeError(f"no breadcrumb for {type(obj).__name__}")


@register.inclusion_tag("_breadcrumbs.html")
def breadcrumbs(*objects: object, here: str = "") -> dict:
    """Render the trail to the last of ``objects``; ``here`` names a sub-page.

    ``{% breadcrumbs task %}``: Conversations › its conversation › the task.
    ``{% breadcrumbs owner artifact %}``: the owner's trail, then the artifact.
    ``{% breadcrumbs conversation here="Delete" %}``: … › the conversation › Delete.
    The last crumb is the page itself (``aria-current="page"``, not a link).
    """
    trail = crumb_trail(objects[0] if objects else None)
    for obj in objects[1:]:
        trail += crumb_trail(obj)
    if here:
        trail.append((here, ""))
    return {"trail": trail}


@register.inclusion_tag("_messages.html", takes_context=True)
def flash_messages(context, *, partial: bool = False) -> dict:
    """Show django messages once, to the page that answers the user's own request.

    A full page (``partial=False``, in base.html) shows them. A fragment
    (``partial=True``) shows them only in the answer to an htmx POST (the user's
    action), swapped out of band into the page's message region. A poll, an
    htmx GET, never reads them, so they stay for the page that should show them.
    """
    request = context.get("request")
    htmx = bool(getattr(request, "htmx", False))
    if partial:
        show = htmx and request.method != "GET"
    else:
        show = not htmx
    return {"messages": context.get("messages") if show else None, "oob": partial}
