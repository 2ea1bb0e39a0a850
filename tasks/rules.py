"""The resume rules, in one table: what the worker does, what a person may choose, Dad's words.

Each ``Rule`` is one row of docs/design.md's class table ("Four artifact
classes, four resume rules") or one state a step can be in. It says:

- ``action``: what the executor does with the step. For a step whose
  tool-call envelope was left open: ``adopt`` the saved output,
  ``call_again``, or ``review`` (wait for a person); for any other step:
  ``run``, ``wait`` (a live worker has it), ``none`` (nothing to do) or
  ``blocked`` (a person must act first);
- ``says``: the engineer's sentence (``ResumeAdvice.words``, the details
  fold, a resumed brain's document, the worker's log); ``{fields}`` are
  filled in by ``tasks.resume``;
- ``words``: Dad's words, what the task page and the MCP door show first;
- ``choices``: what a person may choose while the step waits
  (``tasks.actions.step_resolve``), each one offered only when its entry in
  ``only_if`` holds (``intact``: the saved output is there and matches its
  sha; ``remakeable``: a render's sources are all there and intact).

``uncertain_rule`` picks the rule for an open envelope from the step's
facts; the worker acts on it (``tasks.resume.uncertain_decide``) and a person
is offered its choices (``tasks.actions.step_resolve_options``), so the two
cannot disagree. This module reads no database: ``tasks.resume`` gathers the
facts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from artifacts.models import ArtifactClass
from artifacts.quota import REASON_QUOTA

# What the executor does with a step whose envelope is open.
ADOPT = "adopt"
CALL_AGAIN = "call_again"
REVIEW = "review"

# What a person may choose for a step that waits (tasks.words.CHOICES has
# their words; "retry", a new request, is offered beside these by
# tasks.actions.step_choices).
STOPS = ("fail", "skip")
ANY = ("adopt", "rerun", *STOPS)


@dataclass(frozen=True)
class Rule:
    key: str
    action: str
    says: str
    words: str
    choices: tuple[str, ...] = ()
    only_if: dict[str, str] = field(default_factory=dict)

    def offered(self, facts: Facts) -> list[str]:
        """The choices a person has now, given the step's facts."""
        return [c for c in self.choices if facts.holds(self.only_if.get(c, ""))]


@dataclass
class Facts:
    """What the rules read about a step whose envelope is open."""

    side_effects: bool
    artifact_class: int
    unsaved: str  # why its output could not be saved ("" when it was, or never ran)
    saved: bool  # a payload with a sha was recorded
    # Checked only when a rule asks (each reads blobs):
    verify: Callable[[], bool]  # the saved payload is there and matches its sha
    sources: Callable[[], bool]  # a render's sources are all there and intact

    @cached_property
    def intact(self) -> bool:
        """A payload was saved, and it is there and matches its sha."""
        return self.saved and self.verify()

    @cached_property
    def remakeable(self) -> bool:
        """The same call can make the same output again (a render needs its sources)."""
        return self.artifact_class != ArtifactClass.RENDER or self.sources()

    def holds(self, name: str) -> bool:
        return not name or bool(getattr(self, name))


_RULES = (
    # -- a step whose tool-call envelope was left open (the class table) --------
    Rule(
        "side_effects_unsaved_review",
        REVIEW,
        "needs you: the tool ran; its output could not be saved: {unsaved}",
        "This step acts outside Pippa (it sends or writes something). It ran,"
        " but what it answered could not be saved, so Pippa will not do it"
        " again without you.",
        ANY,
        {"adopt": "intact"},
    ),
    Rule(
        "side_effects_review",
        REVIEW,
        "needs you: the tool has outside effects",
        "This step acts outside Pippa (it sends or writes something). Pippa cannot"
        " tell whether it went out, so it will not do it again without you.",
        ANY,
        {"adopt": "intact"},
    ),
    Rule(
        "quota_review",
        REVIEW,
        "needs you: the tool ran; its output could not be saved: {unsaved}",
        "It ran, but its answer did not fit in the storage you are allowed:"
        " free some space (or ask for more), then choose.",
        ANY,
        {"adopt": "intact", "rerun": "remakeable"},
    ),
    Rule(
        "class1_reuse_file",
        ADOPT,
        "will reuse the saved file (its sha matches)",
        "The file it made is still there and unchanged: Pippa will use it.",
        ANY,
    ),
    Rule(
        "class1_regenerate_missing",
        CALL_AGAIN,
        "will make the file again: it is gone or no longer matches its sha",
        "The file it made is gone or was changed: Pippa will make it again.",
        ("rerun", *STOPS),
    ),
    Rule(
        "class1_regenerate_unsaved",
        CALL_AGAIN,
        "will make the file again: its checksum was never saved",
        "The file was never recorded: Pippa will make it again.",
        ("rerun", *STOPS),
    ),
    Rule(
        "class2_fetch_again",
        CALL_AGAIN,
        "will fetch again",
        "Fetching the same data again is safe: Pippa will fetch it again.",
        ANY,
        {"adopt": "intact"},
    ),
    Rule(
        "class3_adopt_snapshot",
        ADOPT,
        "will reuse the saved {noun}snapshot",
        "The answer it got was saved: Pippa will use that saved answer"
        " (a one-time answer is never fetched again).",
        # A saved snapshot is never taken twice (a retry makes a new one).
        ("adopt", *STOPS),
    ),
    Rule(
        "class3_snapshot_lost",
        REVIEW,
        "needs you: the saved snapshot is missing or damaged,"
        " and a snapshot is never taken twice",
        "The saved answer is missing or damaged, and a one-time answer is never"
        " fetched twice: you decide.",
        STOPS,
    ),
    Rule(
        "class3_issue_again_unshown",
        CALL_AGAIN,
        "will issue the call again: no snapshot was saved, so none was shown",
        "Its answer was never saved or shown to anyone, so Pippa will ask again.",
        ("rerun", *STOPS),
    ),
    Rule(
        "class4_reuse_render",
        ADOPT,
        "will reuse the saved render (its sha matches)",
        "The picture it drew was saved intact: Pippa will use it.",
        ANY,
        # A render from dead sources would not be the same render.
        {"rerun": "remakeable"},
    ),
    Rule(
        "class4_rerender",
        CALL_AGAIN,
        "will render again from its sources (all present and intact)",
        "Pippa will draw it again from the same results (they are all still there).",
        ("rerun", *STOPS),
    ),
    Rule(
        "class4_sources_gone",
        REVIEW,
        "needs you: a source of this render is gone or damaged",
        "Something it was drawn from is gone or damaged: you decide.",
        STOPS,
    ),
    # -- any other step (tasks.resume.resume_advice) ----------------------------
    Rule(
        "done_keep",
        "none",
        "done: its saved output is kept",
        "It is finished: Pippa keeps what it saved.",
    ),
    Rule("skipped", "none", "skipped: resume passes over it", "It was skipped."),
    Rule(
        "failed_retry",
        "blocked",
        "failed after {attempts} attempt(s): retry it to run again",
        "It failed every attempt it was allowed.",
        ("rerun", "skip"),
    ),
    Rule(
        "needs_review",
        "blocked",
        "needs you: it was set aside for a person",
        # Its choices are the class rule's, for the step as it is now.
        "It was set aside for a person: Pippa will not go on without you.",
    ),
    Rule(
        "in_progress",
        "wait",
        "running now on {owner}",
        "A worker is running it right now.",
    ),
    Rule(
        "no_attempts_left",
        "run",
        "will fail: no attempts left",
        "It has used every attempt it was allowed: Pippa will mark it failed.",
    ),
    Rule(
        "retry_wait",
        "run",
        "will run attempt {attempt} of {max_attempts}: the tool failed,"
        " next attempt {when}",
        "Its tool failed; Pippa will try again shortly.",
    ),
    Rule(
        "run",
        "run",
        "will run (attempt {attempt} of {max_attempts})",
        "Pippa will run it.",
    ),
    # -- a person's decision (tasks.actions.step_resolve) ------------------------
    Rule(
        "operator_adopt",
        "none",
        "a person chose to use the saved output",
        "A person chose to use the saved output.",
    ),
    Rule(
        "operator_rerun",
        "run",
        "a person chose to run the same call again",
        "A person chose to run the same call again.",
    ),
    Rule(
        "operator_fail",
        "none",
        "a person chose to stop here",
        "A person chose to stop the task at this step.",
    ),
    Rule(
        "operator_skip",
        "none",
        "a person chose to skip the step",
        "A person chose to skip this step.",
    ),
)
RULES: dict[str, Rule] = {rule.key: rule for rule in _RULES}


def rule_words(key: str) -> str:
    """Dad's words for a rule recorded in an event ("" for a key no rule has)."""
    rule = RULES.get(key)
    return rule.words if rule else ""


def uncertain_rule(facts: Facts) -> Rule:
    """Apply docs/design.md's class table to a step whose envelope is open."""
    if facts.side_effects:
        key = "side_effects_unsaved_review" if facts.unsaved else "side_effects_review"
    elif facts.unsaved.startswith(REASON_QUOTA):
        # Whatever the class: calling the tool again would meet the same
        # quota; a person frees space or raises it, then decides.
        key = "quota_review"
    else:
        key = _class_rule(facts)
    return RULES[key]


def _class_rule(facts: Facts) -> str:
    cls = facts.artifact_class
    if cls == ArtifactClass.FILE:
        if facts.intact:
            return "class1_reuse_file"
        return (
            "class1_regenerate_missing" if facts.saved else "class1_regenerate_unsaved"
        )
    if cls == ArtifactClass.FETCH:
        return "class2_fetch_again"
    if cls == ArtifactClass.SNAPSHOT:
        if facts.intact:
            return "class3_adopt_snapshot"
        return "class3_snapshot_lost" if facts.saved else "class3_issue_again_unshown"
    # Class 4: a derived render.
    if facts.intact:
        return "class4_reuse_render"
    return "class4_rerender" if facts.remakeable else "class4_sources_gone"
