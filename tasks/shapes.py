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
