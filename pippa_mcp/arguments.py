"""The types of the MCP tools' arguments, with their limits (in the JSON schema).

Every limit is a constant: the rule's own where a service enforces it
(``tasks.limits``, ``tasks.shapes``, ``council.services``,
``artifacts.services``), or one named here for what only this door has (a
page, a cursor, an inline payload, the databases' integer range).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from artifacts.models import Artifact
from council.services import BRAIN_NAME_MAX, PARTICIPANT_NAME_MAX
from tasks import shapes
from tasks.limits import WORKER_NAME_MAX
from tasks.models import Step
from tasks.shapes import (
    Title,
    TitleOrEmpty,
    ToolName,
)
from tasks.words import CHOICES

MAX_STORE_BYTES = 1024 * 1024
# Rows a page of a list holds unless the caller asks for fewer (at most MAX_PAGE).
PAGE_ROWS = 50
MAX_PAGE = 200
# A cursor is a few dozen characters (answers.cursor_after); past this it is not one.
MAX_CURSOR_CHARS = 200
# The largest ids and positions the databases store (a BigAutoField, a
# PositiveIntegerField): a larger number is refused in the schema, not by a DataError.
ID_MAX = 2**63 - 1
POSITION_MAX = 2**31 - 1
# A sha256 as refs carry it: the hex digest an artifact row stores.
SHA256_CHARS = Artifact._meta.get_field("sha256").max_length


# -- argument types -------------------------------------------------------------------

# Strict: JSON true is not task 1, and "5" is not 5.
Id = Annotated[int, Field(strict=True, ge=1, le=ID_MAX)]
Position = Annotated[int, Field(strict=True, ge=1, le=POSITION_MAX)]
# The name a calling agent gives itself; a lease is held under it.
Worker = Annotated[
    str,
    Field(
        max_length=WORKER_NAME_MAX,
        description="your own name, e.g. claude-laptop; the lease is held under it",
    ),
]
Flag = Annotated[bool, Field(strict=True)]
Limit = Annotated[
    int,
    Field(strict=True, ge=1, le=MAX_PAGE, description=f"rows a page, 1 to {MAX_PAGE}"),
]
Cursor = Annotated[
    str | None,
    Field(
        max_length=MAX_CURSOR_CHARS,
        description="next_cursor of the page before; leave it out for the first page",
    ),
]
ArtifactClassValue = Annotated[shapes.ArtifactClassValue, Field(strict=True)]
# The statuses are Step.Status's, written out for the tool's JSON schema.
StepStatus = Literal[tuple(Step.Status.values)]
# The ways forward are tasks.words.CHOICES's (what the dashboard offers too).
DecisionAction = Literal[tuple(CHOICES)]


class StepIn(BaseModel):
    """One step of a new plan."""

    model_config = ConfigDict(extra="forbid", strict=True)

    title: Title
    tool: Annotated[ToolName, Field(description="a name from list_step_tools")]
    args: dict[str, Any] = Field(
        default_factory=dict, description="small JSON arguments; refs, never payloads"
    )


class PlanItem(BaseModel):
    """One entry of the whole plan, like a todo list item."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: Id | None = Field(
        default=None, description="an existing step's id: keeps that step"
    )
    title: TitleOrEmpty | None = None
    tool: Annotated[str | None, Field(max_length=shapes.TOOL_NAME_MAX)] = None
    args: dict[str, Any] | None = None
    status: StepStatus | None = Field(
        default=None,
        description="the status you believe it has; a different stored status is refused",
    )


class Participant(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=PARTICIPANT_NAME_MAX)]
    brain: str = Field(
        default="other",
        max_length=BRAIN_NAME_MAX,
        description="claude, codex, kimi, grok, glm, gemini, ollama or other",
    )


def as_models(items: list, model: type[BaseModel]) -> list:
    """``items`` as ``model`` instances: the SDK passes models, a direct caller dicts."""
    return [i if isinstance(i, model) else model.model_validate(i) for i in items]
