"""What resume will do with each step: the class rules, and their words.

``uncertain_decide`` settles a step whose tool-call envelope was left open,
by its artifact class; ``resume_advice`` says what resuming will do with any
step, in words a person understands. The executor acts on exactly the
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
from artifacts.quota import REASON_QUOTA
from artifacts.store import CHUNK, default_store
from tasks.models import Event, Step, Task
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

ADOPT = "adopt"
CALL_AGAIN = "call_again"
REVIEW = "review"


@dataclass(frozen=True)
class ResumeAdvice:
    rule: str
    words: str
    # What the executor does: adopt / call_again / review (uncertain), run,
    # wait (a live worker has it), none (nothing to do), blocked (needs a person).
    action: str = "none"


@dataclass
class Envelope:
    """The step's current tool-call envelope, read from its own events."""

    open: bool = False
    started: dict[str, Any] | None = None
    payload: dict[str, Any] | None = None
    starts: int = 0
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
            env.starts += 1
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


def uncertain_decide(step: Step, env: Envelope) -> ResumeAdvice:
    """Apply docs/design.md's class table ("Four artifact classes, four resume
    rules") to a step whose envelope is open."""
    has_payload = bool(env.payload and env.payload.get("sha"))
    if step.side_effects and env.unsaved:
        return ResumeAdvice(
            "side_effects_unsaved_review",
            f"needs you: the tool ran; its output could not be saved: {env.unsaved}",
            REVIEW,
        )
    if step.side_effects:
        return ResumeAdvice(
            "side_effects_review", "needs you: the tool has outside effects", REVIEW
        )
    if env.unsaved.startswith(REASON_QUOTA):
        # Whatever the class: calling the tool again would meet the same
        # quota; a person frees space or raises it, then retries.
        return ResumeAdvice(
            "quota_review",
            f"needs you: the tool ran; its output could not be saved: {env.unsaved}",
            REVIEW,
        )
    cls = step.artifact_class
    if cls == ArtifactClass.FILE:
        if has_payload and payload_intact(cls, env.payload):
            return ResumeAdvice(
                "class1_reuse_file",
                "will reuse the saved file (its sha matches)",
                ADOPT,
            )
        if has_payload:
            return ResumeAdvice(
                "class1_regenerate_missing",
                "will make the file again: it is gone or no longer matches its sha",
                CALL_AGAIN,
            )
        return ResumeAdvice(
            "class1_regenerate_unsaved",
            "will make the file again: its checksum was never saved",
            CALL_AGAIN,
        )
    if cls == ArtifactClass.FETCH:
        return ResumeAdvice("class2_fetch_again", "will fetch again", CALL_AGAIN)
    if cls == ArtifactClass.SNAPSHOT:
        if has_payload and payload_intact(cls, env.payload):
            return ResumeAdvice(
                "class3_adopt_snapshot",
                f"will reuse the saved {_noun(step)}snapshot",
                ADOPT,
            )
        if has_payload:
            return ResumeAdvice(
                "class3_snapshot_lost",
                "needs you: the saved snapshot is missing or damaged,"
                " and a snapshot is never taken twice",
                REVIEW,
            )
        return ResumeAdvice(
            "class3_issue_again_unshown",
            "will issue the call again: no snapshot was saved, so none was shown",
            CALL_AGAIN,
        )
    # Class 4: a derived render.
    if has_payload and payload_intact(cls, env.payload):
        return ResumeAdvice(
            "class4_reuse_render",
            "will reuse the saved render (its sha matches)",
            ADOPT,
        )
    if sources_alive(source_ids_for(step, env.payload)):
        return ResumeAdvice(
            "class4_rerender",
            "will render again from its sources (all present and intact)",
            CALL_AGAIN,
        )
    return ResumeAdvice(
        "class4_sources_gone",
        "needs you: a source of this render is gone or damaged",
        REVIEW,
    )


def _noun(step: Step) -> str:
    return "search " if "search" in step.tool else ""


def resume_advice(step: Step, *, task: Task | None = None) -> ResumeAdvice:
    """Say, in plain words, what resuming the task will do with this step."""
    task = task or step.task
    status = step.status
    if status == Step.Status.DONE:
        return ResumeAdvice("done_keep", "done: its saved output is kept")
    if status == Step.Status.SKIPPED:
        return ResumeAdvice("skipped", "skipped: resume passes over it")
    if status == Step.Status.FAILED:
        return ResumeAdvice(
            "failed_retry",
            f"failed after {step.attempts} attempt(s): retry it to run again",
            "blocked",
        )
    if status == Step.Status.NEEDS_REVIEW:
        env = envelope_read(step.pk)
        reason = env.review_reason or "needs you: it was set aside for a person"
        return ResumeAdvice(
            env.review_rule or "needs_review",
            reason if reason.startswith("needs you") else f"needs you: {reason}",
            "blocked",
        )
    if status == Step.Status.RUNNING:
        if task.lease_live:
            return ResumeAdvice(
                "in_progress", f"running now on {task.lease_owner}", "wait"
            )
        env = envelope_read(step.pk)
        if env.open:
            return uncertain_decide(step, env)
    if step.attempts >= step.max_attempts:
        return ResumeAdvice("no_attempts_left", "will fail: no attempts left", "run")
    if step.waiting_to_retry:
        return ResumeAdvice(
            "retry_wait",
            f"will run attempt {step.attempts + 1} of {step.max_attempts}: the tool"
            f" failed, next attempt {relative_text(step.next_attempt_at)}",
            "run",
        )
    return ResumeAdvice(
        "run",
        f"will run (attempt {step.attempts + 1} of {step.max_attempts})",
        "run",
    )
