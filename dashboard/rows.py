"""Timeline rows, each settled one drawn once per server process.

A live task page is polled every 2 s by every open tab, and most of its rows
are settled steps (done, skipped, or not yet started) that change only by a
transition: rendering them again on every poll was most of a poll's cost. A
settled row's HTML is kept here under what it is
drawn from (``selectors.settled_row_key``), so the next poll, tab or viewer
of the same task reuses it. Its bars are in absolute milliseconds; only the
axis (the SVG ``viewBox``) follows the task's clock, and is filled in on the
way out.

Event rows are drawn once per event in the same way: events are never
updated.

Process-local (each server process keeps its own, bounded, least recently
used first out): no shared cache to run, nothing to invalidate by hand.
"""

from __future__ import annotations

from collections import OrderedDict
from html import escape
from threading import Lock

from django.template.defaultfilters import filesizeformat
from django.template.loader import get_template
from django.urls import NoReverseMatch, reverse
from django.utils import dateformat, timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language

from dashboard.selectors import EventPage, StepRow, TaskClock
from dashboard.templatetags.pippa import duration
from dashboard.templatetags.pippa_words import (
    attempt_words,
    class_meaning,
    class_word,
    event_words,
    json_long,
    json_summary,
    pretty_json,
)
from tasks.models import Event, Step, Task


def _escaped(value) -> str:
    if hasattr(value, "__html__"):
        return value.__html__()
    return escape(str(value))  # what django.utils.html.escape returns, unwrapped


def html_format(template: str, *args, **kwargs) -> SafeString:
    """``format_html`` with the same escaping, without its lazy wrappers per
    argument (they were a third of a fresh page's drawing)."""
    return SafeString(
        template.format(
            *(_escaped(a) for a in args),
            **{k: _escaped(v) for k, v in kwargs.items()},
        )
    )


ROW_TEMPLATE = "tasks/task_detail.html#step-row"
MAX_ROWS = 5000  # ~1.5 KB each: a few MB per server process at most
# The axis placeholder in a drawn row. Text from the database is escaped
# (``<`` becomes ``&lt;``), so no step title or output can contain it.
AXIS = mark_safe("<@axis@>")
# Where a live update marks the row to be swapped in out of band.
OOB = mark_safe("<@oob@>")
# Where a done step's branch link goes once the task is idle: the link comes
# and goes with the task, the row stays drawn.
BRANCH = mark_safe("<@branch@>")
BRANCH_LINK = (
    '\n      <div class="step-actions">\n        <a class="button quiet" '
    'id="branch-{pk}" href="{url}?after_position={position}">'
    "Branch from step {position}…</a>\n      </div>\n      "
)


class DrawnRows:
    """A bounded, thread-safe map of row keys to HTML, least recently used out."""

    def __init__(self, limit: int = MAX_ROWS):
        self.limit = limit
        self._rows: OrderedDict[tuple, str] = OrderedDict()
        self._lock = Lock()

    def get(self, key: tuple) -> str | None:
        with self._lock:
            html = self._rows.get(key)
            if html is not None:
                self._rows.move_to_end(key)
            return html

    def put(self, key: tuple, html: str) -> None:
        with self._lock:
            self._rows[key] = html
            self._rows.move_to_end(key)
            while len(self._rows) > self.limit:
                self._rows.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)


drawn_rows = DrawnRows()
# Events are never updated: each is drawn once, under its own id.
drawn_events = DrawnRows()


# A step not started yet: most of a new task's page, drawn as the step-row
# partial would (tests/tasks/test_views_live.py compares the two).
UNTOUCHED_ROW = (
    '\n    <li{oob} class="step step-pending" id="step-{position}">\n'
    '      <div class="step-head">\n'
    '        <span class="pos" aria-hidden="true">{position}</span>\n'
    '        <span class="step-title"><span class="visually-hidden">Step {position}: '
    "</span><bdi>{title}</bdi></span>\n"
    '        <span class="badge status-pending">{status}</span>\n'
    '        <span class="cls cls-{cls}" title="{meaning}">{word}</span>\n'
    "      </div>\n"
    '      <p class="step-meta">\n        not started\n{outside}      </p>\n'
    "    </li>\n"
)
OUTSIDE = '        · <span class="warn">acts outside Pippa</span>\n'


def _head(step: Step) -> dict:
    """What every row's head line shows of its step (both fast rows)."""
    return {
        "oob": OOB,
        "position": step.position,
        "title": step.title,
        "status": step.get_status_display(),
        "cls": step.artifact_class,
        "meaning": class_meaning(step.artifact_class),
        "word": class_word(step.artifact_class),
    }


def untouched_row_html(row: StepRow) -> str | None:
    """Draw the row of a step never started without the template, or None."""
    step = row.step
    plain = (
        step.status == Step.Status.PENDING
        and not step.attempts
        and step.next_attempt_at is None
        and step.started_at is None
        and not step.error
        and step.output_id is None
        and row.advice is None
        and not row.attempts
        and not row.notes
    )
    if not plain:
        return None
    return html_format(
        UNTOUCHED_ROW,
        **_head(step),
        outside=mark_safe(OUTSIDE) if step.side_effects else "",
    )


# A step done in one attempt with a plain output: most of a busy page, drawn
# as the step-row partial would (tests/tasks/test_views_live.py compares them).
DONE_ROW = (
    '\n    <li{oob} class="step step-done" id="step-{position}">\n'
    '      <div class="step-head">\n'
    '        <span class="pos" aria-hidden="true">{position}</span>\n'
    '        <span class="step-title"><span class="visually-hidden">Step {position}: '
    "</span><bdi>{title}</bdi></span>\n"
    '        <span class="badge status-done">{status}</span>\n'
    '        <span class="cls cls-{cls}" title="{meaning}">{word}</span>\n'
    "      </div>\n"
    '      <p class="step-meta">\n        {attempts}\n{took}{outside}      </p>\n'
    "{bars}"
    '      <div class="output">\n{preview}'
    '        <p class="output-meta">\n'
    '          <a href="{detail_url}"><bdi>{output_title}</bdi></a>\n'
    "          · {media_type} · {size}\n"
    '          · <a href="{source_url}" download>Download</a>\n'
    "        </p>\n      </div>\n      {branch}\n    </li>\n"
)
DONE_BARS = (
    '      <svg class="bars" viewBox="0 0 {axis} 14" preserveAspectRatio="none" '
    'width="100%" height="14" role="img" aria-label="When the attempts of step '
    "{position} ran, on the task's time axis\">\n"
    '        <rect class="bar-track" x="0" y="6" width="100%" height="2"></rect>\n'
    '        <rect class="bar bar-{outcome}" x="{x}" y="2" width="{w}" height="10">'
    "<title>Attempt {number}: {words}{took}</title></rect>\n      </svg>\n"
)
EXCERPT = (
    '          <pre class="excerpt" id="excerpt-{step}-{artifact}" hx-preserve '
    'tabindex="0">{text}{more}</pre>\n'
)
IMAGE = (
    '          <img class="thumb" src="{src}" id="thumb-{step}-{artifact}" '
    'hx-preserve alt="Output of step {position}: {title}" loading="lazy" '
    'width="160">\n'
)


def done_row_html(row: StepRow, task: Task, clock: TaskClock) -> str | None:
    """Draw the row of a step done in one attempt without the template, or None.

    Only the plain case: one attempt or none, no notes, no error, an output
    shown as an excerpt, an image or a download. Anything else is the
    template's.
    """
    step, a = row.step, row.step.output
    plain = (
        step.status == Step.Status.DONE
        and a is not None
        and row.advice is None
        and len(row.attempts) <= 1
        and not row.failed_attempts
        and not row.notes
        and not step.error
        and row.preview in ("excerpt", "image", "binary")
    )
    if not plain:
        return None
    try:
        detail_url = reverse("artifacts:detail", args=[a.pk])
        source_url = reverse("artifacts:source", args=[a.pk])
    except NoReverseMatch:
        return None
    bars = ""
    if row.attempts and clock.started_at:
        attempt = row.attempts[0]
        took = attempt.duration
        bars = html_format(
            DONE_BARS,
            axis=AXIS,
            position=step.position,
            outcome=attempt.outcome,
            x=attempt.bar_x,
            w=attempt.bar_w,
            number=attempt.number,
            words=attempt_words(attempt.outcome),
            took=f", {duration(took)}" if took else "",
        )
    if row.preview == "excerpt":
        preview = html_format(
            EXCERPT,
            step=step.pk,
            artifact=a.pk,
            text=row.excerpt,
            more="…" if row.excerpt_truncated else "",
        )
    elif row.preview == "image":
        preview = html_format(
            IMAGE,
            src=source_url,
            step=step.pk,
            artifact=a.pk,
            position=step.position,
            title=a.title or "image",
        )
    else:
        preview = ""
    if step.attempts:
        attempts = f"attempt {step.attempts} of {step.max_attempts}"
    else:
        attempts = "not started"
    return html_format(
        DONE_ROW,
        **_head(step),
        attempts=attempts,
        took=html_format("        · took {}\n", duration(step.duration))
        if step.duration
        else "",
        outside=mark_safe(OUTSIDE) if step.side_effects else "",
        bars=bars,
        preview=preview,
        detail_url=detail_url,
        output_title=a.title or "Output",
        media_type=a.media_type,
        size=filesizeformat(a.size),
        source_url=source_url,
        branch=BRANCH if step.position < task.steps_total else "",
    )


def rows_draw(
    *, rows: list[StepRow], task: Task, clock: TaskClock, oob: bool = False
) -> None:
    """Fill every row's ``html``: drawn now, or as drawn before, on this clock.

    ``oob``: for a live update, each row replaces its namesake in the page.
    """
    template = None
    for row in rows:
        if not row.html:
            html = untouched_row_html(row) or done_row_html(row, task, clock)
            if html is None:
                template = template or get_template(ROW_TEMPLATE)
                html = template.render(
                    {
                        "row": row,
                        "task": task,
                        "clock": clock,
                        "axis": AXIS,
                        "oob": OOB,
                        "branch": BRANCH,
                    }
                )
            if row.reusable:
                drawn_rows.put(row.key, html)
            row.html = html
    span = str(clock.span_ms)
    mark = ' hx-swap-oob="true"' if oob else ""
    branch_url = reverse("tasks:task_branch", args=[task.pk]) if task.is_idle else ""
    for row in rows:
        html = row.html.replace(AXIS, span).replace(OOB, mark)
        if BRANCH in html:
            step = row.step
            link = BRANCH_LINK.format(
                pk=step.pk, url=branch_url, position=step.position
            )
            html = html.replace(BRANCH, link if task.is_idle else "")
        row.html = SafeString(html)


EVENT_ROW = (
    "\n      <tr>\n        <td>{}</td>\n"
    '        <td><time datetime="{}" title="{}">{}</time></td>\n'
    '        <td><span title="{}">{}</span></td>\n'
    '        <td class="data">{}</td>\n      </tr>\n'
)


def _event_times(at) -> tuple[str, str]:
    """``date:"l j F Y, H:i:s.u e"`` and ``date:"j M Y, H:i:s"``, as the
    template writes them (English names: the site's one language), without
    Django's format parser for each of a page's hundred calls."""
    if get_language() not in (None, "en", "en-us"):
        return (
            dateformat.format(at, "l j F Y, H:i:s.u e"),
            dateformat.format(at, "j M Y, H:i:s"),
        )
    clock = f"{at.hour:02d}:{at.minute:02d}:{at.second:02d}"
    return (
        f"{WEEKDAYS[at.weekday()]} {at.day} {MONTHS[at.month - 1]} {at.year}, "
        f"{clock}.{at.microsecond:06d} {at.tzname() or ''}",
        f"{at.day} {MONTHS[at.month - 1][:3]} {at.year}, {clock}",
    )


WEEKDAYS = (
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
)
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def event_row_html(event: Event) -> str:
    """One event's row of the log: its seq, time, kind in words and data.

    Plain format_html rather than a template: a busy page draws 50 new ones a
    poll, and four cells do not need a template engine.
    """
    at = timezone.localtime(event.created_at)
    data = event.data
    summary = json_summary(data)
    if json_long(data):
        cell = html_format(
            '<details><summary><code>{}</code></summary><pre class="json-data" '
            'tabindex="0">{}</pre></details>',
            summary,
            pretty_json(data),
        )
    else:
        cell = html_format("<code>{}</code>", summary)
    return html_format(
        EVENT_ROW,
        event.seq,
        at.isoformat(),
        *_event_times(at),
        event.kind,
        event_words(event.kind),
        cell,
    )


def events_draw(*, page: EventPage) -> None:
    """Give every event of the page its row's HTML (``event.html``)."""
    for event in page.events:
        # Ids are never reused once committed; the rest guards a stray one.
        key = (event.pk, event.task_id, event.seq, event.kind, event.created_at)
        html = drawn_events.get(key)
        if html is None:
            html = event_row_html(event)
            drawn_events.put(key, html)
        event.html = html
