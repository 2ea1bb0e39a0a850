"""What each MCP tool answers: the rows of ``tasks.shapes`` and
``council.shapes``, plus what only this door adds.

A tool declares one of these as its return type; the SDK publishes its JSON
schema as the tool's ``outputSchema`` and validates every answer against it
before it leaves the server (a mismatch is a server error, never a silently
different answer). What the door adds to a row is its ``pippa://`` address
(``uri``, readable with ``resources/read``), the excerpt of a step's output
after ``run_next_step``, and the envelope of a page: ``next_cursor`` and a
``message`` a model can read even when the page is empty.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from council.shapes import ParticipantRef, RoundOut
from tasks.shapes import (
    ArtifactOut,
    ArtifactRefOut,
    ConversationOut,
    Shape,
    StepOut,
    TaskOut,
    TaskSummaryOut,
)

URI = Field(description="this row's pippa:// address, for resources/read")


class ArtifactRef(ArtifactRefOut):
    """An artifact ref and its address."""

    uri: str = URI


class StepDoc(StepOut):
    """A step whose output ref carries its address."""

    output: ArtifactRef | None


class TaskDoc(TaskOut):
    """A task and its plan, each output ref with its address."""

    uri: str = URI
    steps: list[StepDoc]


class UsageOut(Shape):
    """The brain turns recorded on a task and the tokens they used."""

    turns: int
    counted_turns: int
    input_tokens: int
    output_tokens: int
    total_tokens: int


class TaskWithUsage(TaskDoc):
    usage: UsageOut


class TaskBrief(TaskSummaryOut):
    """A task without its steps, and its address."""

    uri: str = URI


class ConversationItem(ConversationOut):
    uri: str = URI


class ArtifactDoc(ArtifactOut):
    """An artifact's ref, sources and API address, and its pippa:// address."""

    uri: str = URI


# -- pages ---------------------------------------------------------------------


class Page(Shape):
    """One page of a list: its rows, where the next page starts, and a sentence."""

    next_cursor: str | None = Field(
        description="pass it as cursor to read the next page; null: this is the last"
    )
    message: str = Field(description="what this page holds, in words")


class ConversationPage(Page):
    conversations: list[ConversationItem]


class TaskPage(Page):
    tasks: list[TaskBrief]


class StepToolOut(Shape):
    """A tool a step may run, and the JSON schema of its arguments."""

    name: str
    artifact_class: int
    side_effects: bool
    media_type: str
    description: str
    args_schema: dict[str, Any] = Field(
        description="JSON schema of the step's args (its properties, types and defaults)"
    )


class StepToolPage(Page):
    tools: list[StepToolOut]


class Choice(Shape):
    """One way forward for a step that waits for a decision (the card's words)."""

    action: str
    label: str
    words: str
    recommended: bool
    needs_confirm: bool
    warning: str


class DecisionOut(Shape):
    """A step that waits for a decision, what happened, and its ways forward."""

    step_id: int
    position: int
    title: str
    tool: str
    status: str
    side_effects: bool
    what_happened: str
    rule: str
    plain_words: str
    choices: list[Choice]


class DecisionPage(Page):
    decisions: list[DecisionOut]


class RoundPage(Page):
    rounds: list[RoundOut]


# -- answers of the tools that act ----------------------------------------------


class StepOutput(ArtifactRef):
    """A step's output right after it ran, with the head of its text."""

    excerpt: str | None = None
    truncated: bool | None = None
    note: str | None = None


class RanStep(StepOut):
    output: StepOutput | None


class StepRunAnswer(Shape):
    """What run_next_step did: the step it ran (if any) and where the task stands."""

    ran: bool
    detail: str
    rule: str
    step: RanStep | None
    task: TaskBrief


class TaskActionAnswer(Shape):
    """What pause_task, resume_task and cancel_task did, in a sentence."""

    message: str
    task: TaskBrief


class StepState(Shape):
    id: int
    position: int
    status: str


class DecideAnswer(Shape):
    message: str
    step: StepState
    task: TaskBrief


class PreviewRef(Shape):
    id: int
    sha256: str


class ArtifactReadOut(Shape):
    """The metadata of what artifact_read returned as content (text or PNG)."""

    artifact: ArtifactDoc
    view: Literal["source", "preview"]
    truncated: bool | None = Field(
        default=None, description="source only: whether the text was cut at 256 KiB"
    )
    preview: PreviewRef | None = Field(
        default=None, description="preview only: the PNG artifact shown"
    )


class CompletedStep(Shape):
    """What complete_step did: the step, its output's ref and address, and
    where the task stands (``tasks.shapes.StepCompleteOut``)."""

    completed: bool
    already: bool
    detail: str
    rule: str
    step: StepDoc
    task: TaskBrief


class StoredArtifact(ArtifactDoc):
    """The artifact artifact_store wrote (or found: already_stored)."""

    already_stored: bool
    note: str | None = None


class TurnAdded(Shape):
    turn_id: int
    order: int
    round_id: int
    artifact_refs: list[ParticipantRef]
