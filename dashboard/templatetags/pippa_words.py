"""Dad's words in templates: class legend, event kinds, actors, folded JSON."""

from __future__ import annotations

import json

from django import template

from tasks import words

register = template.Library()

MAX_SUMMARY_CHARS = 90


@register.filter
def class_word(value: int) -> str:
    """Return "file", "fetch", "snapshot" or "render" for an artifact class."""
    try:
        return words.CLASS_LEGEND[int(value)][0]
    except (KeyError, TypeError, ValueError):
        return str(value)


@register.filter
def class_meaning(value: int) -> str:
    """Return the legend line of an artifact class, for a badge's title."""
    try:
        return words.CLASS_LEGEND[int(value)][1]
    except (KeyError, TypeError, ValueError):
        return ""


@register.simple_tag
def class_legend() -> list[tuple[int, str, str]]:
    return [
        (int(k), word, meaning) for k, (word, meaning) in words.CLASS_LEGEND.items()
    ]


@register.filter
def event_words(kind: str) -> str:
    return words.EVENT_WORDS.get(str(kind), str(kind).replace("_", " "))


@register.filter
def actor_words(actor: str) -> str:
    return words.actor_words(str(actor or ""))


def _json_line(value: object) -> str:
    return json.dumps(value, default=str, separators=(", ", ": "))


@register.filter
def json_summary(value: object) -> str:
    """Return event data as one line of JSON, cut to ``MAX_SUMMARY_CHARS``
    (the fold's summary; ``json_long`` says whether it was cut)."""
    text = _json_line(value)
    if len(text) > MAX_SUMMARY_CHARS:
        return text[: MAX_SUMMARY_CHARS - 1] + "…"
    return text


@register.filter
def json_long(value: object) -> bool:
    return len(_json_line(value)) > MAX_SUMMARY_CHARS


@register.filter
def pretty_json(value: object) -> str:
    return json.dumps(value, default=str, indent=2, ensure_ascii=False)


@register.filter
def attempt_words(outcome: str) -> str:
    return words.ATTEMPT_WORDS.get(str(outcome), str(outcome))


@register.filter
def error_words(error: str) -> str:
    """What went wrong, in Dad's words (``tasks.words.error_words``): no
    exception's name; the full error stays in the engineer's fold."""
    return words.error_words(str(error or ""))


@register.simple_tag
def steps_done_words(done: int, total: int, skipped: int = 0) -> str:
    """ "3 of 4 steps done", "2 of 4 steps done, 1 skipped", "1 of 1 step
    skipped, none done": a skipped step is finished, but nothing was done."""
    done, total, skipped = int(done or 0), int(total or 0), int(skipped or 0)
    real = max(0, done - skipped)
    steps = "step" if total == 1 else "steps"
    if skipped and not real:
        return f"{skipped} of {total} {steps} skipped, none done"
    if skipped:
        return f"{real} of {total} {steps} done, {skipped} skipped"
    return f"{done} of {total} {steps} done"


@register.filter
def media_words(media_type: str) -> str:
    """What a file is, in a word Dad knows: "picture", "table", "data", "text"…"""
    return words.media_words(str(media_type or ""))


@register.filter
def keeper_words(role: str) -> str:
    """How a task or a council turn keeps an artifact, in Dad's words."""
    return words.KEEPER_WORDS.get(str(role), str(role))
