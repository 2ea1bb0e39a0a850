"""What resume will do with each step, by the rules of ``tasks.rules``.

``uncertain_decide`` settles a step whose tool-call envelope was left open,
by its artifact class; ``resume_advice`` says what resuming will do with any
step. Both read the rules' one table (``tasks.rules.RULES``): this module
gathers the facts the rules read (the envelope, whether a saved payload
verifies, whether a render's sources do). The executor acts on exactly the
decision ``uncertain_decide`` returns, so the advice shown is the thing that
happens. The document a resumed brain reads, which carries this advice for
the steps still to run, is ``tasks.resume_document``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.models import Artifact, ArtifactClass
from artifacts.store import CHUNK, default_store
from tasks.models import Event, Step, Task
from tasks.rules import (  # noqa: F401  (ADOPT, CALL_AGAIN, REVIEW: the executor's names)
    ADOPT,
    CALL_AGAIN,
    REVIEW,
    RULES,
    Facts,
    rule_words,
    uncertain_rule,
)
from tasks.tools import files_root
from tasks.words import relative_text

# Kinds that open or close a tool-call envelope, in the step's own log.
ENVELOPE_KINDS = (
    Event.Kind.TOOL_CALL_STARTED,
    Event.Kind.PAYLOAD_PERSISTED,
    Event.Kind.OUTPUT_UNSAVED,
    Event.Kind.TOOL_RESULT_PERSISTED,
    Event.Kind.TOOL_CALL_FAILED,
    Event.Kind.STEP_RETRIED,
    Event.Kind.STEP_RESOLVED,
    Event.Kind.STEP_NEEDS_REVIEW,
    Event.Kind.UNCERTAIN_RESOLVED,
)
CLOSING_KINDS = {
    Event.Kind.TOOL_RESULT_PERSISTED,
    Event.Kind.TOOL_CALL_FAILED,
    Event.Kind.STEP_RETRIED,
    Event.Kind.STEP_RESOLVED,
}


@dataclass(frozen=True)
class ResumeAdvice:
    rule: str  # a key of tasks.rules.RULES (or one an older event recorded)
    words: str  # the engineer's sentence
    # What the executor does: adopt / call_again / review (uncertain), run,
    # wait (a live worker has it), none (nothing to do), blocked (needs a person).
    action: str = "none"

    @property
    def plain_words(self) -> str:
        """Dad's words for the rule (the needs-a-person words for one no rule has)."""
        return rule_words(self.rule) or (
            rule_words("needs_review") if self.action == "blocked" else ""
        )


@dataclass
class Envelope:
    """The step's current tool-call envelope, read from its own events."""

    open: bool = False
    started: dict[str, Any] | None = None
    payload: dict[str, Any] | None = None
    review_reason: str = ""
    review_rule: str = ""
    # The tool returned but its output could not be saved: why ("disk full").
    unsaved: str = ""


def envelope_read(step_id: int) -> Envelope:
    """Fold the step's envelope events (current generation only) into an Envelope."""
    env = Envelope()
    rows = (
        Event.objects.filter(step_id=step_id, kind__in=ENVELOPE_KINDS)
        .order_by("seq")
        .values_list("kind", "data")
    )
    for kind, data in rows:
        if kind == Event.Kind.STEP_RETRIED:
            env = Envelope()
        elif kind == Event.Kind.TOOL_CALL_STARTED:
            env.open, env.started, env.payload, env.unsaved = True, data, None, ""
        elif kind == Event.Kind.PAYLOAD_PERSISTED:
            env.payload = data
        elif kind == Event.Kind.OUTPUT_UNSAVED:
            env.unsaved = data.get("reason") or "unknown"
        elif kind == Event.Kind.STEP_NEEDS_REVIEW:
            env.review_reason = data.get("reason", "")
            env.review_rule = data.get("rule", "")
        if kind in CLOSING_KINDS:
            env.open = False
    return env


def _file_sha(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def class1_file(payload: dict[str, Any]) -> Path | None:
    """Return the class-1 file a payload names, if it is there and hashes to its sha."""
    rel = payload.get("path")
    if not rel:
        return None
    root = files_root().resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root):
        return None
    return path if _file_sha(path) == payload.get("sha") else None


def payload_intact(step_class: int, payload: dict[str, Any] | None) -> bool:
    """True when the persisted payload can be adopted as it is."""
    if not payload or not payload.get("sha"):
        return False
    if step_class == ArtifactClass.FILE:
        return class1_file(payload) is not None
    return default_store().verify(payload["sha"])


def source_ids_for(step: Step, payload: dict[str, Any] | None) -> list[int] | None:
    """The artifacts a class-4 step renders from; None when a source step has no output.

    The persisted payload names them when there is one; otherwise the step's
    ``sources`` arg (positions) does, else every earlier step.
    """
    if payload and payload.get("source_ids"):
        return [int(x) for x in payload["source_ids"]]
    args = step.args if isinstance(step.args, dict) else {}
    wanted = args.get("sources", args.get("source"))
    if isinstance(wanted, int):
        wanted = [wanted]
    earlier = Step.objects.filter(task_id=step.task_id, position__lt=step.position)
    if wanted:
        earlier = earlier.filter(position__in=[int(x) for x in wanted])
    rows = list(earlier.values_list("status", "output_id"))
    if wanted and len(rows) != len(set(wanted)):
        return None
    ids = []
    for status, output_id in rows:
        if status == Step.Status.SKIPPED:
            continue
        if output_id is None:
            return None
        ids.append(output_id)
    return ids


def sources_alive(ids: list[int] | None) -> bool:
    if ids is None:
        return False
    shas = dict(Artifact.objects.filter(pk__in=ids).values_list("pk", "sha256"))
    if len(shas) != len(set(ids)):
        return False
    store = default_store()
    return all(store.verify(sha) for sha in shas.values())


def uncertain_facts(step: Step, env: Envelope) -> Facts:
    """What the resume rules read about a step whose envelope is open."""
    return Facts(
        side_effects=step.side_effects,
        artifact_class=step.artifact_class,
        unsaved=env.unsaved,
        saved=bool(env.payload and env.payload.get("sha")),
        verify=lambda: payload_intact(step.artifact_class, env.payload),
        sources=lambda: sources_alive(source_ids_for(step, env.payload)),
    )


def uncertain_decide(step: Step, env: Envelope) -> ResumeAdvice:
    """The rule (``tasks.rules``) for a step whose envelope is open, as advice."""
    rule = uncertain_rule(uncertain_facts(step, env))
    return _advice(rule.key, unsaved=env.unsaved, noun=_noun(step))


def _advice(key: str, **fields: Any) -> ResumeAdvice:
    rule = RULES[key]
    return ResumeAdvice(key, rule.says.format(**fields), rule.action)


def _noun(step: Step) -> str:
    return "search " if "search" in step.tool else ""


def resume_advice(step: Step, *, task: Task | None = None) -> ResumeAdvice:
    """Say, in plain words, what resuming the task will do with this step."""
    task = task or step.task
    status = step.status
    if status == Step.Status.DONE:
        return _advice("done_keep")
    if status == Step.Status.SKIPPED:
        return _advice("skipped")
    if status == Step.Status.FAILED:
        return _advice("failed_retry", attempts=step.attempts)
    if status == Step.Status.NEEDS_REVIEW:
        env = envelope_read(step.pk)
        reason = env.review_reason or RULES["needs_review"].says
        return ResumeAdvice(
            env.review_rule or "needs_review",
            reason if reason.startswith("needs you") else f"needs you: {reason}",
            "blocked",
        )
    if status == Step.Status.RUNNING:
        if task.lease_live:
            return _advice("in_progress", owner=task.lease_owner)
        env = envelope_read(step.pk)
        if env.open:
            return uncertain_decide(step, env)
    if step.attempts >= step.max_attempts:
        return _advice("no_attempts_left")
    fields = {"attempt": step.attempts + 1, "max_attempts": step.max_attempts}
    if step.waiting_to_retry:
        return _advice("retry_wait", when=relative_text(step.next_attempt_at), **fields)
    return _advice("run", **fields)
