"""Task page rows drawn once by their partial and kept in Django's cache.

A task page draws up to 100 step rows (and, with its event log open, 50
event rows); drawing a step row costs about 0.2 ms (some 37 variables; its
output's three links are ``StepRow`` properties that reverse no route per
row), most of a finished task's page. A row of a settled step (done or
skipped, or never tried) changes only when something it shows changes, and
an event never changes, so ``{% kept_rows %}``
(``templatetags/pippa_rows.py``) keeps such rows' markup in the ``rows``
cache (``settings.CACHES``) and draws only the others, with the same
partial.

The key cannot miss a field the partial reads. Every path the partial
reads is listed in its kind's ``reads`` (``row.attempts.*.bar_x``: that
attribute of every attempt), and a test
(``tests/dashboard/test_rowcache.py``) draws each partial with a recording
context and fails if it reads any path not in the list. For an event row
the key holds the values of those paths. A step row is keyed on what it is
made from (``StepRow.sources``): every column of its step and of its
output, whatever the model's fields are; the step's last event, since its
attempts and notes are folded from its events, which are appended and never
changed; and whether its text output's file is there (the bytes are named
by their sha). The same test holds every ``row.`` path of the list to one of
those (``STEP_ROW_MADE_OF``), so a row the cache serves reads none of its
file or its events: a page of kept rows reads its steps and nothing more.
Outside those values a row depends on what every row of the page reads
alike (``task.pk``, ``clock.started_at``...: the list's other paths), on the
code that draws it (the template's source, the filters' modules, the URL
routes: ``code_version``), on the time zone and the script prefix
(``_page_values``), and on "now" for the relative times ("5 min ago") of a
step's attempts and notes; a row that shows those (``settled``) is never
kept, and the same test fails if a kept row reads the clock. No user is in
the key: the partials read nothing of the viewer, and a page reaches its
rows only after its owner check.

One value every row shows alike moves while a task runs: the time axis its
bars are drawn on (``clock.span_ms``, each row's ``viewBox``), which reaches
now. It is a kind's ``late`` path: rows are drawn with a stand-in for it
(``<pippa-late-…>``, which no escaped text can spell) and the value goes in
once the list is drawn, so a settled row of a running task is kept all the
same, and a kept row never holds an axis. Two parts of a step row are shown
or not by the page, not by the row: a live update's ``hx-swap-oob`` and a
done step's branch link (shown once its task is idle). They are ``{% late
if … %}`` parts (``LatePart``): a kept row holds each drawn between two
stand-ins, and each one's condition is read once a list at every draw, so a
row drawn while its task ran is the same row once it stops, a poll's row is
the page's row, and a page of kept rows draws no part of a row.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import re
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from operator import attrgetter
from pathlib import Path
from typing import Any

import django
from django.core.cache import caches
from django.template import Node
from django.template.base import render_value_in_context
from django.urls import get_resolver, get_script_prefix, get_urlconf
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import get_language

from dashboard.selectors.timeline import may_keep, rows_complete

ALIAS = "rows"

# Every path the step-row partial reads: a name of the context, then
# attributes; ``*`` stands for each item of a list. The paths outside ``row``
# are in the key (a list's own value as its length, another object's as its
# truth: the recording test fails if the partial prints or compares one
# whole, unless the path is in the kind's ``whole``: then the key holds its
# repr); the row's own are made from its sources (STEP_ROW_MADE_OF).
STEP_ROW_READS = (
    "clock.started_at",
    "task.steps_total",
    "task.branch_url",
    "row.step",
    "row.step.pk",
    "row.step.position",
    "row.step.title",
    "row.step.status",
    "row.step.get_status_display",
    "row.step.attempts",
    "row.step.max_attempts",
    "row.step.duration",
    "row.step.started_at",
    "row.step.waiting_to_retry",
    "row.step.next_attempt_at",
    "row.step.side_effects",
    "row.step.error",
    "row.step.tool",
    "row.step.artifact_class",
    "row.step.output",
    "row.step.output.pk",
    "row.step.output.title",
    "row.step.output.media_type",
    "row.step.output.size",
    "row.detail_url",
    "row.source_url",
    "row.preview_url",
    "row.advice",
    "row.preview",
    "row.excerpt",
    "row.excerpt_truncated",
    "row.shows_attempts",
    "row.attempts",
    "row.attempts.*",
    "row.attempts.*.number",
    "row.attempts.*.generation",
    "row.attempts.*.outcome",
    "row.attempts.*.duration",
    "row.attempts.*.started_at",
    "row.attempts.*.error",
    "row.attempts.*.note",
    "row.attempts.*.bar_x",
    "row.attempts.*.bar_w",
    "row.failed_attempts",
    "row.notes",
    "row.notes.*",
    "row.notes.*.actor",
    "row.notes.*.words",
    "row.notes.*.at",
)

# What a step row shows besides its step's and its output's columns, and
# what each is made from: all of it is in ``StepRow.sources`` (a test holds
# every ``row.`` path of STEP_ROW_READS to a column or to this list).
STEP_ROW_MADE_OF = {
    "row.step.get_status_display": "the step's status",
    "row.step.duration": "the step's started_at and finished_at",
    "row.step.waiting_to_retry": "the step's status and next_attempt_at",
    "row.detail_url": "the output's id and the routes (code_version)",
    "row.source_url": "the output's id and the routes (code_version)",
    "row.preview_url": "the output's id and the routes (code_version)",
    "row.preview": "the output's media type and meta, and its file",
    "row.excerpt": "the output's file (named by its sha) or meta",
    "row.excerpt_truncated": "the output's file",
    "row.advice": "none: a row with a decision is never kept (may_keep)",
    "row.shows_attempts": "the step's events",
    "row.attempts": "the step's events (bars: clock.started_at, a page value)",
    "row.failed_attempts": "the step's events",
    "row.notes": "the step's events",
}

# What the step-row partial reads that every row of a page shows alike and
# that moves while a task runs (module docstring): drawn in after the rows.
STEP_ROW_LATE = ("clock.span_ms",)

# The event-row partial: an event's number, time, kind and data (whole: the
# filters print it). Events are never updated (EventQuerySet refuses), but
# the key holds what the row shows all the same: an id alone would serve a
# stale row after a database is restored, or rolled back in a test.
EVENT_ROW_READS = ("e.seq", "e.created_at", "e.kind", "e.data")
EVENT_ROW_WHOLE = frozenset({"e.data"})

# The code a row's markup comes from besides its template: the filters and
# the properties the partial reads. A deploy that changes any of them (or
# the template, or a URL route) changes every key, so a shared cache never
# serves a row drawn by other code.
CODE_MODULES = (
    "dashboard.rowcache",
    "dashboard.selectors.clock",
    "dashboard.selectors.outputs",
    "dashboard.selectors.timeline",
    "dashboard.templatetags.pippa",
    "dashboard.templatetags.pippa_words",
    "tasks.models",
    "tasks.words",
    "artifacts.models",
)

LEAVES = (
    str,
    int,
    float,
    bool,
    decimal.Decimal,
    dt.datetime,
    dt.date,
    dt.timedelta,
    type(None),
)
MISSING = "<missing>"


def settled(row) -> bool:
    """Whether a step row may be kept: only a write to its step, its output
    or its events changes it, and it shows no time relative to now
    (``selectors.may_keep``), nor its attempts and notes unfolded, each with
    its time in words ("5 min ago")."""
    return may_keep(row.step) and not row.shows_attempts


LEAF_TYPES = frozenset(LEAVES)


def plain(value: Any) -> Any:
    """A value as the key holds it: a leaf as itself, a list as its length,
    anything else as its truth; a method is called first, as a template does."""
    if type(value) in LEAF_TYPES:
        return value
    if callable(value) and not isinstance(value, type):
        value = value()
        if type(value) in LEAF_TYPES:
            return value
    if isinstance(value, LEAVES):
        # A subclass (SafeString, a choice) by its type too: a SafeString is
        # printed unescaped where a str with the same text is escaped.
        return (type(value).__name__, value)
    if isinstance(value, list | tuple):
        return len(value)
    return bool(value)


def _tree(paths: list[list[str]]) -> dict:
    """Paths as a tree of attribute names, so each object is read once."""
    tree: dict = {}
    for bits in paths:
        node = tree
        for bit in bits:
            node = node.setdefault(bit, {})
    return tree


def _compile(tree: dict, whole: frozenset[str], path: str):
    """A function of an object giving the key's values of ``tree`` below it
    (``attrgetter`` reads an object's attributes at once). No list's items
    are read here: a step row, the one partial that reads them
    (``row.attempts.*``), is keyed on its sources."""
    if not tree:
        return lambda value: ()
    names = list(tree)
    get = attrgetter(*names)
    below = [
        (i, _compile(tree[n], whole, f"{path}.{n}"))
        for i, n in enumerate(names)
        if tree[n]
    ]
    reprs = [i for i, n in enumerate(names) if f"{path}.{n}" in whole]
    single = len(names) == 1

    def values(obj):
        if obj is None:
            return None
        got = get(obj)
        if single:
            got = (got,)
        out = [plain(v) for v in got]
        for i in reprs:
            out[i] = repr(got[i])
        for i, fn in below:
            out.append(fn(got[i]))
        return tuple(out)

    return values


class RowKind:
    """A partial drawn once per item of a list, and when its rows may be kept.

    An item's part of the key is ``sources(item)`` when given (what the item
    is made from), else the values of the ``reads`` below ``var``.
    ``may_keep(item)`` says which items are looked up at all, ``complete``
    reads what the ones not found still lack (at once), and ``kept(item)``,
    asked of a row drawn, whether it may be kept; ``late`` paths are drawn
    in after the rows."""

    def __init__(
        self,
        partial,
        var,
        reads,
        kept,
        whole=frozenset(),
        late=(),
        *,
        sources=None,
        may_keep=None,
        complete=None,
    ):
        self.partial = partial  # the partial's name, and the keys' prefix
        self.var = var  # the name each item has in the partial
        self.reads = reads
        self.kept = kept
        self.may_keep = may_keep or kept
        self.complete = complete or (lambda items: None)
        # "root.name" paths drawn in after the rows (module docstring)
        self.late: dict[str, dict[str, SafeString]] = {}
        for n, path in enumerate(late):
            root, name = path.split(".")
            self.late.setdefault(root, {})[name] = SafeString(f"<pippa-late-{n}>")
        roots: dict[str, list[list[str]]] = {}
        for p in reads:
            root, *bits = p.split(".")
            roots.setdefault(root, []).append(bits)
        item_reads = roots.pop(var, [])
        self.item_values = sources or _compile(_tree(item_reads), whole, var)
        self.page_readers = {
            root: _compile(_tree(paths), whole, root)
            for root, paths in sorted(roots.items())
        }


# True while ``render_rows`` draws rows: each LatePart draws itself between
# its stand-ins.
_DRAWING: ContextVar[bool] = ContextVar("pippa_rows_drawing", default=False)


class LatePart(Node):
    """``{% late if CONDITION %}…{% endlate %}``: a part of a row shown or
    not by a condition of the page, not of the row. For what a kept row
    shows that changes with the page: the live update's ``hx-swap-oob``,
    and a done step's branch link, shown once its task is idle (so a row
    drawn while the task ran is the same row once it stops, and a poll's
    row the same as the page's). A kept row holds the part drawn, between
    two stand-ins (``<pippa-part-N>…</pippa-part-N>``, which no escaped text
    can spell): what the part reads is in the row's key like the rest of
    the row. The condition, which reads only the page's names, is read once
    a list at every draw, and the part shown (its stand-ins taken out) or
    cut out of every row at once (``show``). Drawn anywhere else (a partial
    rendered alone), the part is drawn in place when its condition holds."""

    def __init__(self, condition, nodelist, number: int):
        self.condition = condition
        self.nodelist = nodelist
        self.opener = f"<pippa-part-{number}>"
        self.closer = f"</pippa-part-{number}>"
        self._section = re.compile(
            f"{re.escape(self.opener)}.*?{re.escape(self.closer)}", re.DOTALL
        )

    def holds(self, context) -> bool:
        """Whether the part is shown: its condition, as ``{% if %}`` reads it."""
        return bool(self.condition.resolve(context, ignore_failures=True))

    def render(self, context):
        if _DRAWING.get():
            return SafeString(self.opener + self.nodelist.render(context) + self.closer)
        return self.nodelist.render(context) if self.holds(context) else ""

    def show(self, markup: str, shown: bool) -> str:
        """``markup`` (rows drawn between this part's stand-ins) with the part
        shown in every row, or cut out of every row."""
        if shown:
            return markup.replace(self.opener, "").replace(self.closer, "")
        return self._section.sub("", markup)


def late_parts(partial) -> list[LatePart]:
    """The LateParts of a partial, in order (found once per partial)."""
    found = partial.__dict__.get("_pippa_late_parts")
    if found is None:
        found = partial._pippa_late_parts = partial.nodelist.get_nodes_by_type(LatePart)
    return found


@contextmanager
def drawing_rows():
    """Draw as ``render_rows`` does: each LatePart drawn between its
    stand-ins, whatever its condition (a test's recorder reads what a kept
    row holds within this)."""
    token = _DRAWING.set(True)
    try:
        yield
    finally:
        _DRAWING.reset(token)


class _Late:
    """An object of the context whose late attributes read as their stand-ins."""

    def __init__(self, obj, stand_ins: dict[str, SafeString]):
        self._obj = obj
        self._stand_ins = stand_ins

    def __getattr__(self, name):
        if name in self._stand_ins:
            return self._stand_ins[name]
        return getattr(self._obj, name)


STEP_ROW = RowKind(
    "step-row",
    "row",
    STEP_ROW_READS,
    settled,
    late=STEP_ROW_LATE,
    sources=lambda row: row.sources(),
    may_keep=lambda row: may_keep(row.step),
    complete=rows_complete,
)
EVENT_ROW = RowKind("event-row", "e", EVENT_ROW_READS, lambda e: True, EVENT_ROW_WHOLE)
KINDS = {kind.partial: kind for kind in (STEP_ROW, EVENT_ROW)}


def _page_values(kind: RowKind, context) -> tuple:
    """What every row of one list reads alike: the names outside the item,
    the time zone, the script prefix and URL namespace ``{% url %}`` uses,
    escaping."""
    values = []
    for name, read in kind.page_readers.items():
        try:
            root = context[name]
        except KeyError:
            values.append(MISSING)
            continue
        values.append((plain(root), read(root)))
    request = getattr(context, "request", None)  # as {% url %} reads it
    current_app = getattr(request, "current_app", None)
    if current_app is None:
        current_app = getattr(
            getattr(request, "resolver_match", None), "namespace", None
        )
    return (
        tuple(values),
        timezone.get_current_timezone_name(),
        get_language(),
        get_script_prefix(),
        current_app,
        context.autoescape,
    )


@cache
def _modules_version() -> str:
    digest = hashlib.sha256(django.get_version().encode())
    for name in CODE_MODULES:
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


@cache
def _routes_version(urlconf: str | None) -> str:
    """Every route of the URLconf, named or not, with its namespace."""
    digest = hashlib.sha256()

    def walk(resolver, prefix: str) -> None:
        for pattern in resolver.url_patterns:
            digest.update(
                f"{prefix}{pattern.pattern}|{getattr(pattern, 'name', '')}|".encode()
            )
            if hasattr(pattern, "url_patterns"):
                walk(pattern, f"{prefix}{pattern.pattern}[{pattern.namespace}]")

    walk(get_resolver(urlconf), "")
    return digest.hexdigest()


def template_version(source: str) -> str:
    """The hash of a template's source: what ``{% kept_rows %}`` keeps of it."""
    return hashlib.sha256(source.encode()).hexdigest()


@cache
def code_version(template: str, urlconf: str | None = None) -> str:
    """The version of the code a row comes from: ``template``'s hash, the
    modules of CODE_MODULES, Django's version, the routes of ``urlconf``."""
    return hashlib.sha256(
        f"{template}|{_modules_version()}|{_routes_version(urlconf)}".encode()
    ).hexdigest()[:16]


class _Keys:
    """The keys of one list's rows: the code's version and the page's values,
    hashed once, then each row's values (``kind.item_values``)."""

    def __init__(self, kind: RowKind, version: str, page: tuple):
        self.prefix = f"{kind.partial}:{version}:"
        self.page = hashlib.blake2b(f"{page!r}|".encode(), digest_size=20)

    def __call__(self, values: tuple) -> str:
        digest = self.page.copy()
        digest.update(repr(values).encode())
        return self.prefix + digest.hexdigest()


def render_rows(kind: RowKind, partial, context, items, template: str) -> SafeString:
    """Draw ``items`` with ``partial`` as ``{% for <var> in items %}{% partial
    %}`` would, the ones that may be kept from the cache when they are there
    (one read for the list)."""
    key_of = _Keys(
        kind, code_version(template, get_urlconf()), _page_values(kind, context)
    )
    values = {
        i: kind.item_values(item) for i, item in enumerate(items) if kind.may_keep(item)
    }
    keys = {i: key_of(v) for i, v in values.items()}
    store = caches[ALIAS]
    found = store.get_many(keys.values()) if keys else {}
    # What the rows to draw still lack, read at once; a row found reads none.
    kind.complete([item for i, item in enumerate(items) if keys.get(i) not in found])
    drawn, fresh = [], {}
    late, stand_ins = {}, {}
    for root, names in kind.late.items():
        obj = context.get(root)
        if obj is not None:
            late[root] = _Late(obj, names)
            for name, stand_in in names.items():
                value = getattr(obj, name)
                stand_ins[stand_in] = render_value_in_context(value, context)
    with context.push(late), drawing_rows():
        for i, item in enumerate(items):
            key = keys.get(i)
            markup = found.get(key) if key else None
            if markup is None:
                with context.push({kind.var: item}):
                    markup = partial.render(context)
                # Kept under its key only if what it is made from did not
                # change while it was read (a file gone between its stat and
                # its read): else drawn, and looked up again next time. The
                # values are compared, not hashed again: only this request
                # changes the objects it holds, never a value's type.
                if key and kind.kept(item) and kind.item_values(item) == values[i]:
                    fresh[key] = str(markup)
            drawn.append(markup)
    if fresh:
        store.set_many(fresh)
    out = "".join(drawn)
    for part in late_parts(partial):  # each condition read once for the list
        out = part.show(out, part.holds(context))
    for stand_in, value in stand_ins.items():
        out = out.replace(stand_in, value)
    return SafeString(out)


def clear(**kwargs) -> None:
    """Empty the rows cache (on ``setting_changed``: tests that change a
    setting a row's markup may depend on)."""
    caches[ALIAS].clear()
