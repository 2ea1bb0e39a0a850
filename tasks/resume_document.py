"""The resume document (``pippa.resume/3``): what every brain reads, bounded.

Every door hands a brain this one document (the runner before each turn, the
JSON API's ``resume-context``, MCP's ``resume_context``, the task page's
fold), in the shapes of ``tasks.shapes`` (``ResumeOut``). It says where the
task stands, never how it got there:

- the task and its steps counted by status;
- the step to run next and a few after it (``next``), each with what resume
  will do with it (``tasks.resume.resume_advice``);
- the last few finished steps (``recent``) with their outputs' refs and the
  first characters of each output's text;
- the short note the brain left on the task (``tasks.services.task_note_write``);
- how many steps it does not show (``earlier_done``, ``later``), which a brain
  reads page by page with ``read_steps`` (``steps_read``) when it needs them.

Its size does not grow with the plan: it is always whole JSON of at most
``max_chars`` characters (``MAX_CHARS`` by default), never cut. When the
fields of a plan (long titles, large args, a long note) would make it
longer, the size rules (``RULES``) shorten fields, one rule after the other,
until it fits, and ``trimmed`` names the rules that did.

``document_words`` says the same in Dad's words, for the task page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from django.db.models import Count

from artifacts.models import Artifact
from artifacts.selectors import artifact_text_head
from pippa_site.errors import Invalid
from pippa_site.text import TITLE_MAX
from tasks.documents import artifact_ref, task_summary
from tasks.limits import (
    DOCUMENT_MAX_CHARS,
    DOCUMENT_MIN_CHARS,
    MAX_PAGE_STEPS,
    NOTE_MAX_CHARS,
    PAGE_STEPS,
)
from tasks.models import Event, Step, Task
from tasks.resume import resume_advice
from tasks.shapes import (
    ResumeDoneOut,
    ResumeNextOut,
    ResumeNoteOut,
    ResumeOut,
    ResumeRuleOut,
    ResumeTaskOut,
    StepOut,
    StepPageOut,
)

# 3: bounded. The step list became counts, the next few steps, the last few
# finished ones (with excerpts), the brain's note and a pointer to read_steps.
SCHEMA = "pippa.resume/3"

# The most characters of the document's JSON (``document_text``); a door may
# ask for less (a brain with a small context), down to ``MIN_CHARS``.
MAX_CHARS = DOCUMENT_MAX_CHARS
MIN_CHARS = DOCUMENT_MIN_CHARS
NEXT_STEPS = 4  # the step to run next and three after it
RECENT_STEPS = 3
EXCERPT_CHARS = 160


ERR_MAX_CHARS = f"max_chars must be from {MIN_CHARS} to {MAX_CHARS}"
ERR_POSITION = "from_position and to_position are step positions, 1 or more"
ERR_RANGE = "to_position ({to}) comes before from_position ({start})"
ERR_STATUS = "status must be one of {choices}"
ERR_LIMIT = f"limit must be from 1 to {MAX_PAGE_STEPS}"
ERR_TOO_LARGE = "the resume document of task {id} does not fit in {limit} characters"

WORDS_READ_STEPS = "{parts}: read them with read_steps (from_position and to_position, or status; up to {page} a page)"
WORDS_ALL_LISTED = "every step is listed here"


@dataclass(frozen=True)
class Limits:
    """How much of each field the document shows; a size rule lowers one."""

    next_steps: int = NEXT_STEPS
    recent_steps: int = RECENT_STEPS
    excerpt: int = EXCERPT_CHARS  # 0: no excerpt (null)
    title: int = TITLE_MAX
    args: int | None = None  # longest args JSON shown (None: all; 0: none)
    note: int = NOTE_MAX_CHARS
    error: int = 300


# The size rules, in the order they apply, each on top of the ones before:
# first what a brain can read again with one call (an excerpt: read_artifact;
# args: read_steps), then what it can do without (later steps, older
# results), last what it wrote itself (the note). The last of them leaves a
# document well under ``MIN_CHARS`` whatever the plan holds.
RULES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("excerpts", {"excerpt": 80}),
    ("args", {"args": 200}),
    ("titles", {"title": 80}),
    ("next", {"next_steps": 2}),
    ("recent", {"recent_steps": 2}),
    ("note", {"note": 400}),
    ("excerpts", {"excerpt": 0}),
    ("args", {"args": 0}),
    ("titles", {"title": 40}),
    ("next", {"next_steps": 1}),
    ("recent", {"recent_steps": 1}),
    ("errors", {"error": 120}),
    ("note", {"note": 150}),
    ("recent", {"recent_steps": 0}),
    ("titles", {"title": 24}),
    ("errors", {"error": 40}),
)


def document_text(payload: dict[str, Any]) -> str:
    """The document as a brain reads it (and as its size is counted): compact JSON."""
    return json.dumps(payload, ensure_ascii=False)


def _cut(text: str, limit: int) -> str:
    """``text``, shortened to at most ``limit`` characters as JSON writes them
    (a quote or a newline takes two), ending in "…" when shortened."""
    if len(text) * 6 <= limit or _json_len(text) <= limit:
        return text
    kept, used = [], 1  # the "…"
    for char in text:
        used += _json_len(char)
        if used > limit:
            break
        kept.append(char)
    return "".join(kept) + "…"


def _json_len(text: str) -> int:
    # Only quotes, backslashes and control characters take more than one.
    if len(text) == 1 and text not in '"\\' and text >= " ":
        return 1
    return len(json.dumps(text, ensure_ascii=False)) - 2


@dataclass
class _State:
    """What the document is built from, read once; the size rules re-render it."""

    task: Task
    counts: dict[str, int]
    next: list[tuple[Step, Any]]  # (step, its resume advice)
    recent: list[tuple[Step, str | None]]  # (step, the head of its output's text)
    note: tuple[Artifact, str, Any] | None  # (artifact, text, written at)


def _read(task: Task) -> _State:
    task = Task.objects.get(pk=task.pk)
    steps = Step.objects.filter(task_id=task.pk)
    counts = dict(
        steps.order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    upcoming = list(steps.not_done().order_by("position")[:NEXT_STEPS])
    finished = list(
        steps.finished().select_related("output").order_by("-position")[:RECENT_STEPS]
    )
    recent = []
    for step in reversed(finished):
        head = None
        if step.output is not None:
            text = artifact_text_head(artifact=step.output, limit=EXCERPT_CHARS * 2)
            if text.is_text and not text.missing:
                head = " ".join(text.text.split())
        recent.append((step, head))
    return _State(
        task=task,
        counts={status: n for status, n in counts.items() if n},
        next=[(s, resume_advice(s, task=task)) for s in upcoming],
        recent=recent,
        note=note_read(task),
    )


def note_read(task: Task) -> tuple[Artifact, str, Any] | None:
    """The note the brain wrote last on ``task``: (artifact, text, when), or None."""
    event = (
        Event.objects.filter(task_id=task.pk, kind=Event.Kind.NOTE_WRITTEN)
        .order_by("-seq")
        .first()
    )
    if event is None:
        return None
    artifact = Artifact.objects.filter(pk=event.data.get("artifact_id")).first()
    if artifact is None:
        return None
    head = artifact_text_head(artifact=artifact, limit=NOTE_MAX_CHARS * 4)
    text = head.text if head.is_text and not head.missing else ""
    return artifact, text, event.created_at


def note_document(task: Task) -> ResumeNoteOut | None:
    """The note the brain wrote last on ``task``, whole, as the document shows it."""
    return _note_entry(note_read(task), Limits())


def _render(state: _State, limits: Limits, trimmed: list[str]) -> ResumeOut:
    task = state.task
    summary = {
        **task_summary(task),
        "branched_from": task.branched_from_id,
        "branched_after_step": task.branched_at,
    }
    summary["title"] = _cut(summary["title"], limits.title)
    summary["lease_owner"] = _cut(summary["lease_owner"], max(limits.title, 40))
    shown_next = state.next[: limits.next_steps]
    shown_recent = state.recent[-limits.recent_steps :] if limits.recent_steps else []
    finished = sum(n for s, n in state.counts.items() if s in Step.Status.finished())
    unfinished = sum(state.counts.values()) - finished
    earlier = finished - len(shown_recent)
    later = unfinished - len(shown_next)
    return ResumeOut(
        schema_name=SCHEMA,
        task=ResumeTaskOut(**summary),
        counts=state.counts,
        next=[_next_entry(s, advice, limits) for s, advice in shown_next],
        later=later,
        recent=[_done_entry(s, head, limits) for s, head in shown_recent],
        earlier_done=earlier,
        read_steps=_read_steps_words(earlier, later),
        note=_note_entry(state.note, limits),
        trimmed=trimmed,
    )


def _next_entry(step: Step, advice, limits: Limits) -> ResumeNextOut:
    args = step.args if isinstance(step.args, dict) else {}
    args_chars = len(json.dumps(args, ensure_ascii=False))
    shown = limits.args is None or args_chars <= limits.args
    return ResumeNextOut(
        id=step.pk,
        position=step.position,
        title=_cut(step.title, limits.title),
        status=step.status,
        stopped=step.stopped,
        tool=step.tool,
        args=args if shown else None,
        args_chars=args_chars,
        artifact_class=step.artifact_class,
        side_effects=step.side_effects,
        attempts=step.attempts,
        max_attempts=step.max_attempts,
        error=_cut(step.error, limits.error),
        idempotency_key=step.idempotency_key(),
        resume=ResumeRuleOut(rule=advice.rule, words=_cut(advice.words, limits.error)),
    )


def _done_entry(step: Step, head: str | None, limits: Limits) -> ResumeDoneOut:
    output = None
    if step.output is not None:
        ref = artifact_ref(step.output)
        ref["title"] = _cut(ref["title"], limits.title)
        output = ref
    excerpt = None
    if head is not None and limits.excerpt:
        excerpt = _cut(head, limits.excerpt)
    return ResumeDoneOut(
        id=step.pk,
        position=step.position,
        title=_cut(step.title, limits.title),
        status=step.status,
        output=output,
        excerpt=excerpt,
    )


def _note_entry(note, limits: Limits) -> ResumeNoteOut | None:
    if note is None:
        return None
    artifact, text, written_at = note
    return ResumeNoteOut(
        text=_cut(text, limits.note),
        artifact_id=artifact.pk,
        sha256=artifact.sha256,
        written_at=written_at,
    )


def _read_steps_words(earlier: int, later: int) -> str:
    parts = []
    if earlier:
        parts.append(
            f"{earlier} earlier finished step{'s' if earlier != 1 else ''} not listed"
        )
    if later:
        parts.append(f"{later} later step{'s' if later != 1 else ''} to run not listed")
    if not parts:
        return WORDS_ALL_LISTED
    return WORDS_READ_STEPS.format(parts=" and ".join(parts), page=MAX_PAGE_STEPS)


def resume_document(task: Task, *, max_chars: int = MAX_CHARS) -> ResumeOut:
    """Return the document a brain reads before continuing ``task``.

    Whole JSON of at most ``max_chars`` characters (``document_text``): the
    size rules (``RULES``) shorten its fields, in order, until it fits.
    """
    if not MIN_CHARS <= max_chars <= MAX_CHARS:
        raise Invalid(ERR_MAX_CHARS)
    state = _read(task)
    limits = Limits()
    trimmed: list[str] = []
    rules = iter(RULES)
    while True:
        document = _render(state, limits, list(trimmed))
        if len(document_text(document.model_dump(mode="json"))) <= max_chars:
            return document
        try:
            name, change = next(rules)
        except StopIteration:
            # The last rule leaves a few hundred characters whatever the
            # plan holds (tests/tasks/test_resume_document.py walks the worst).
            raise AssertionError(
                ERR_TOO_LARGE.format(id=task.pk, limit=max_chars)
            ) from None
        limits = replace(limits, **change)
        if name not in trimmed:
            trimmed.append(name)


def resume_payload(task: Task, *, max_chars: int = MAX_CHARS) -> dict[str, Any]:
    """The resume document as plain JSON values (a door that sends dicts)."""
    return resume_document(task, max_chars=max_chars).model_dump(mode="json")


# -- older steps, page by page -------------------------------------------------------


def steps_read(
    *,
    task: Task,
    from_position: int = 1,
    to_position: int | None = None,
    status: str | None = None,
    limit: int = PAGE_STEPS,
) -> StepPageOut:
    """Return one page of the task's steps in plan order (``read_steps``).

    From ``from_position`` (1: the first) to ``to_position`` (None: the
    last), only those in ``status`` when given; at most ``limit`` a page.
    The page says where the next one starts (``next_from_position``).
    """
    if from_position < 1 or (to_position is not None and to_position < 1):
        raise Invalid(ERR_POSITION)
    if to_position is not None and to_position < from_position:
        raise Invalid(ERR_RANGE.format(to=to_position, start=from_position))
    if status is not None and status not in Step.Status.values:
        raise Invalid(ERR_STATUS.format(choices=", ".join(Step.Status.values)))
    if not 1 <= limit <= MAX_PAGE_STEPS:
        raise Invalid(ERR_LIMIT)
    steps = Step.objects.filter(task_id=task.pk, position__gte=from_position)
    if to_position is not None:
        steps = steps.filter(position__lte=to_position)
    if status is not None:
        steps = steps.filter(status=status)
    page = list(steps.select_related("output").order_by("position")[: limit + 1])
    more = page[limit] if len(page) > limit else None
    return StepPageOut(
        task_id=task.pk,
        from_position=from_position,
        to_position=to_position,
        status=status,
        matching=steps.count(),
        steps=[StepOut.model_validate(s) for s in page[:limit]],
        next_from_position=None if more is None else more.position,
    )


# -- the same, in Dad's words ---------------------------------------------------------


def _steps_words(positions: list[int]) -> str:
    if len(positions) == 1:
        return f"step {positions[0]} is"
    return f"steps {positions[0]}–{positions[-1]} are"


def document_words(payload: dict[str, Any]) -> str:
    """Say in a sentence what the document tells a brain (the task page's card).

    "It will be told: steps 1–3 are done (with their results); it goes on at
    step 4, Chart the closes."
    """
    task = payload["task"]
    total = task["steps_total"]
    if not total:
        return "It will be told: the task has no steps."
    recent = payload["recent"]
    upcoming = payload["next"]
    finished = payload["earlier_done"] + len(recent)
    clauses = []
    if not finished:
        clauses.append("no step is done yet")
    else:
        first_open = upcoming[0]["position"] if upcoming else total + 1
        if finished == first_open - 1:
            done = _steps_words(list(range(1, finished + 1)))
        else:
            done = f"{finished} of {total} steps are"
        if not recent:
            results = "their results on request"
        elif len(recent) >= finished:
            results = "with its result" if finished == 1 else "with their results"
        else:
            shown, before = len(recent), finished - len(recent)
            results = (
                f"the last {'one' if shown == 1 else shown} with"
                f" {'its result' if shown == 1 else 'their results'},"
                f" the {'one' if before == 1 else before} before on request"
            )
        clauses.append(f"{done} done ({results})")
    if upcoming:
        step = upcoming[0]
        where = f"step {step['position']}, {step['title']}"
        left = len(upcoming) + payload["later"] - 1
        then = f", then {left} more" if left else ""
        if step["status"] in (Step.Status.FAILED, Step.Status.NEEDS_REVIEW):
            clauses.append(f"{where} waits for you before it can go on{then}")
        elif step["status"] == Step.Status.RUNNING:
            clauses.append(f"it goes on at {where} ({step['resume']['words']}){then}")
        else:
            clauses.append(f"it goes on at {where}{then}")
    else:
        clauses.append("there is nothing left to run")
    sentence = "It will be told: " + "; ".join(clauses) + "."
    note = payload.get("note")
    if note and note["text"].strip():
        sentence += (
            f" It also gets the note it left: “{_cut(note['text'].strip(), 160)}”."
        )
    return sentence
