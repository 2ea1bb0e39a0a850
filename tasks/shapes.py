"""The shapes a program reads, defined once: an artifact ref, a step, a task;
and the limits of what it sends, read from their homes.

Every door that shows a program these rows uses these classes: the JSON API
declares them as its response schemas (so its OpenAPI document is this
module), and ``tasks.documents`` builds every other door's dicts through them
(MCP's tools and resources, the resume context, the council's refs, the brain
runner's local backend). A key is renamed, added or dropped here, once, and
every door follows. Each class reads its fields from a model instance
(``from_attributes``); the dicts are ``model_dump()``'s, so a door that sends
JSON sends the same keys, in the same order, as the API.

What a program sends is checked by its door's own models (the API's bodies,
MCP's strict tool arguments), whose fields are the types at the end of this
module: a title, a tool's name, a media type, an artifact class, a plan's
length; each limit is its column's or its service's, named once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from artifacts.models import ArtifactClass
from pippa_site.text import MAX_MEDIA_TYPE, TITLE_MAX
from tasks.models import Step
from tasks.plan import MAX_STEPS


class Shape(BaseModel):
    # A key no class declares is an error, not a key silently dropped.
    model_config = ConfigDict(from_attributes=True, extra="forbid")


class ArtifactRefOut(Shape):
    """An artifact as a program refers to it: metadata and sha, never the payload."""

    id: int
    sha256: str
    artifact_class: int
    class_label: str
    media_type: str
    title: str
    size: int


class ArtifactOut(ArtifactRefOut):
    """An artifact's ref, with the ids it was made from and where its bytes are."""

    source_refs: list[int]
    created_at: datetime
    content_url: str


class StepOut(Shape):
    """A step of a plan: what it runs, its class, where it stands, its output's ref."""

    id: int
    position: int
    title: str
    status: str
    # A failed step that its owner stopped ("Stop here"): it waits for nobody,
    # and nothing runs it again until a person starts it over.
    stopped: bool
    tool: str
    args: dict[str, Any]
    artifact_class: int
    side_effects: bool
    attempts: int
    max_attempts: int
    error: str
    output: ArtifactRefOut | None


class TaskSummaryOut(Shape):
    """A task without its steps: status and progress (a task list's row)."""

    id: int
    conversation_id: int
    title: str
    status: str
    brain: str
    steps_total: int
    steps_done: int
    lease_owner: str


class TaskOut(TaskSummaryOut):
    """A task with its steps in order."""

    steps: list[StepOut]


class ConversationOut(Shape):
    """A conversation and its tasks' ids, oldest first."""

    id: int
    title: str
    created_at: datetime
    task_ids: list[int]


class StepRunOut(Shape):
    """What a runner is told after asking for a step (``tasks.actions.StepRun``)."""

    ran: bool
    detail: str
    invoked: bool
    rule: str
    step: StepOut | None
    task: TaskOut


class StepPageOut(Shape):
    """One page of a task's steps (``read_steps``), in plan order.

    ``next_from_position`` is where the next page starts (null: none left);
    ``matching`` counts every step the filter selects, on all pages.
    """

    task_id: int
    from_position: int
    to_position: int | None
    status: str | None
    matching: int
    steps: list[StepOut]
    next_from_position: int | None


class StepCompleteOut(Shape):
    """What an agent is told after ``complete_step``: the step and its output ref.

    ``already`` says the step was done before with these very bytes (a call
    sent twice), so nothing new was written.
    """

    completed: bool
    already: bool
    detail: str
    rule: str
    step: StepOut
    task: TaskSummaryOut


# -- the resume document (tasks.resume_document) ----------------------------------


class ResumeRuleOut(Shape):
    """What resume will do with an unfinished step: a rule's name and its words."""

    rule: str
    words: str


class ResumeTaskOut(TaskSummaryOut):
    """The task of a resume document: its summary and where it was branched from."""

    branched_from: int | None
    branched_after_step: int | None


class ResumeNextOut(Shape):
    """A step still to run, as a resumed brain reads it.

    ``args`` is null when the document's size rules left it out
    (``args_chars`` says how long it is; ``read_steps`` gives it whole).
    """

    id: int
    position: int
    title: str
    status: str
    stopped: bool
    tool: str
    args: dict[str, Any] | None
    args_chars: int
    artifact_class: int
    side_effects: bool
    attempts: int
    max_attempts: int
    error: str
    idempotency_key: str
    resume: ResumeRuleOut


class ResumeDoneOut(Shape):
    """A finished step: its output's ref and the first characters of its text.

    ``excerpt`` is null for an output that is not text (or is missing).
    """

    id: int
    position: int
    title: str
    status: str
    output: ArtifactRefOut | None
    excerpt: str | None


class ResumeNoteOut(Shape):
    """The short note the brain left on the task (a class-3 artifact of its own)."""

    text: str
    artifact_id: int
    sha256: str
    written_at: datetime


class ResumeOut(Shape):
    """What every brain reads before every turn, through every door: bounded.

    The task, its steps counted by status, the step to run next and a few
    after it (``next``), the last few finished steps (``recent``), the
    brain's own note, and how many steps it is not shown (``earlier_done``
    before ``recent``, ``later`` after ``next``), which ``read_steps`` reads.
    ``trimmed`` names the size rules that shortened it, if any.
    """

    # "schema" would shadow a BaseModel attribute: the field has another name,
    # and the key a program reads (and sends back) is "schema".
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    schema_name: str = Field(alias="schema")
    task: ResumeTaskOut
    counts: dict[str, int]
    next: list[ResumeNextOut]
    later: int
    recent: list[ResumeDoneOut]
    earlier_done: int
    read_steps: str
    note: ResumeNoteOut | None
    trimmed: list[str]


# -- what a program sends ----------------------------------------------------------

Title = Annotated[str, Field(min_length=1, max_length=TITLE_MAX)]
TitleOrEmpty = Annotated[str, Field(max_length=TITLE_MAX)]
TOOL_NAME_MAX = Step._meta.get_field("tool").max_length
ToolName = Annotated[str, Field(min_length=1, max_length=TOOL_NAME_MAX)]
MediaType = Annotated[str, Field(min_length=1, max_length=MAX_MEDIA_TYPE)]
ArtifactClassValue = Annotated[
    int,
    Field(
        ge=int(min(ArtifactClass)),
        le=int(max(ArtifactClass)),
        description=", ".join(f"{c.value} {c.label.lower()}" for c in ArtifactClass),
    ),
]
StepCount = Field(min_length=1, max_length=MAX_STEPS)
