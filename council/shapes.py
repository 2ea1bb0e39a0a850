"""The council's documents as a program reads them, defined once.

``council.selectors`` and ``council.services`` build these documents
(``round_payload``, ``participant_ref``, ``serialize_branch_context``); the
MCP door declares these classes as its tools' output schemas, so every answer
is checked against them. A ref is ``tasks.shapes.ArtifactRefOut`` plus where
to read its bytes over the JSON API and what it was made from.
"""

from __future__ import annotations

from pydantic import Field

from tasks.shapes import ArtifactRefOut, Shape


class ParticipantOut(Shape):
    id: int
    name: str
    brain: str
    position: int


class OutcomeOut(Shape):
    """What a round concluded (``council.services.round_conclude``)."""

    text: str
    by: str = Field(description='who wrote it: "participant:<name>" or the owner')
    at: str = Field(description="when, ISO 8601")


class RoundOut(Shape):
    """A council round, its outcome (null while it has none) and its participants
    in speaking order."""

    id: int
    number: int
    topic: str
    outcome: OutcomeOut | None
    participants: list[ParticipantOut]


class SourceRef(Shape):
    id: int
    sha256: str


class PreviewState(Shape):
    """A widget's PNG preview: made (its id and sha), or why not."""

    status: str
    id: int | None = None
    sha256: str | None = None
    reason: str | None = None


class ParticipantRef(ArtifactRefOut):
    """The ref a participant receives: metadata and JSON API addresses, never bytes."""

    source_url: str = Field(
        description="GET with the same bearer token: the artifact's bytes (JSON API)"
    )
    preview_url: str | None = Field(
        description="GET with the same bearer token: the widget's PNG preview"
    )
    source_refs: list[SourceRef]
    preview: PreviewState | None = None
    role: str | None = None


class Speaker(Shape):
    name: str
    brain: str


class TurnContext(Shape):
    order: int
    speaker: Speaker
    text: str
    artifact_refs: list[ParticipantRef]


class RoundRef(Shape):
    id: int
    number: int
    topic: str
    conversation_id: int
    outcome: OutcomeOut | None


class EarlierRound(Shape):
    """A round before this one: its outcome, and refs to what its turns made."""

    number: int
    topic: str
    outcome: OutcomeOut | None
    artifact_refs: list[ParticipantRef]


class CouncilContext(Shape):
    """What the next speaker of a round receives (pippa.council.context/1)."""

    schema_: str = Field(alias="schema")
    note: str
    round: RoundRef
    for_: Speaker = Field(alias="for")
    earlier_rounds: list[EarlierRound]
    turns: list[TurnContext]
