"""Reads of council rounds for pages and the context endpoints. Read-only."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from artifacts.models import Artifact
from artifacts.preview import STATUS_OK, WIDGET_MEDIA_TYPES, preview_status
from artifacts.store import BlobError, default_store
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from council.services import (
    brain_label,
    outcome_document,
    round_turns,
    serialize_branch_context,
)
from pippa_site.errors import NotFound

ERR_ROUND_NOT_FOUND = "No such council round."
ERR_TURN_NOT_FOUND = "No such turn."
ERR_PARTICIPANT_NOT_FOUND = "No such participant in this round."
ERR_CONTEXT_MISSING = "The stored context of this turn is missing."
ERR_NO_PARTICIPANTS = "this council round has no participants"


def round_get_for_user(*, user, round_id: int, staff: bool = False) -> CouncilRound:
    """Return the round if ``user`` may see its conversation (``pippa_site.owners``;
    staff see every round only with ``staff=True``, as the council pages pass);
    else NotFound."""
    return CouncilRound.objects.select_related("conversation").get_for_user(
        user, round_id, staff=staff, error=ERR_ROUND_NOT_FOUND
    )


def turn_get_for_user(*, user, turn_id: int, staff: bool = False) -> Turn:
    """Return the turn if ``user`` may see its round (as ``round_get_for_user``)."""
    return Turn.objects.select_related(
        "round", "round__conversation", "participant"
    ).get_for_user(user, turn_id, staff=staff, error=ERR_TURN_NOT_FOUND)


def next_participant(*, council_round: CouncilRound) -> Participant | None:
    """The participant after the last speaker, by position (round-robin)."""
    participants = list(council_round.participants.all())
    if not participants:
        return None
    last = (
        Turn.objects.filter(round=council_round)
        .order_by("-order")
        .values_list("participant_id", flat=True)
        .first()
    )
    if last is None:
        return participants[0]
    ids = [p.pk for p in participants]
    index = ids.index(last) if last in ids else -1
    return participants[(index + 1) % len(participants)]


def participant_get(*, council_round: CouncilRound, participant_id) -> Participant:
    try:
        return council_round.participants.get(pk=int(participant_id))
    except (TypeError, ValueError, Participant.DoesNotExist):
        raise NotFound(ERR_PARTICIPANT_NOT_FOUND) from None


def turn_context_sha(*, turn: Turn) -> str:
    """Return the sha256 of the stored context this turn's speaker received."""
    sha = (
        TurnArtifact.objects.filter(turn=turn, role=TurnArtifact.Role.CONTEXT)
        .values_list("artifact__sha256", flat=True)
        .first()
    )
    if sha is None:
        raise NotFound(ERR_CONTEXT_MISSING)
    return sha


def turn_context_bytes(*, turn: Turn, sha256: str | None = None) -> bytes:
    """Return the stored context document this turn's speaker received."""
    try:
        return default_store().get(sha256 or turn_context_sha(turn=turn))
    except BlobError:
        raise NotFound(ERR_CONTEXT_MISSING) from None


@dataclass
class WidgetView:
    artifact: Artifact
    preview_ok: bool
    reason: str


@dataclass
class Citation:
    """An artifact a turn cites, with who made it when a turn of this round did."""

    artifact: Artifact
    author: str = ""


@dataclass
class TurnView:
    turn: Turn
    brain: str
    widgets: list[WidgetView] = field(default_factory=list)
    cited: list[Citation] = field(default_factory=list)
    # The stored context's row only: the page shows its size; its text is read
    # when the reader opens it (turn_context_view), so the page grows linearly.
    context_artifact: Artifact | None = None


@dataclass
class ContextView:
    """One turn's received context, for the fold the round page opens on demand."""

    turn: Turn
    error: str = ""
    # The exact stored text, cut into (text, is_ref) runs for <mark>.
    segments: list[tuple[str, bool]] = field(default_factory=list)
    # Each artifact the refs name, once, with how many times it is named.
    refs: list[tuple[int, int]] = field(default_factory=list)
    # What it held, in words: the question, each earlier turn's speaker with
    # the titles of what it made or cited, and the earlier rounds' outcomes.
    topic: str = ""
    shown: list[tuple[str, list[str]]] = field(default_factory=list)
    earlier: list[dict] = field(default_factory=list)


REFS_KEY = '"artifact_refs"'


def highlight_refs(raw: str) -> list[tuple[str, bool]]:
    """Cut a context's JSON text into runs; the ``artifact_refs`` arrays are marked.

    Scans the exact text (tracking strings and escapes) for the key
    ``"artifact_refs"`` and marks its array value up to the matching bracket,
    so the page shows the bytes as received with the refs highlighted.
    """
    segments: list[tuple[str, bool]] = []
    pos = 0
    while True:
        key = raw.find(REFS_KEY, pos)
        if key < 0:
            break
        start = raw.find("[", key + len(REFS_KEY))
        if start < 0:
            break
        depth, i, in_string = 0, start, False
        while i < len(raw):
            ch = raw[i]
            if in_string:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        end = min(i + 1, len(raw))
        segments.append((raw[pos:start], False))
        segments.append((raw[start:end], True))
        pos = end
    segments.append((raw[pos:], False))
    return [(text, marked) for text, marked in segments if text]


def turn_context_view(*, turn: Turn) -> ContextView:
    """The context ``turn``'s speaker received, with its artifact refs marked."""
    view = ContextView(turn=turn)
    try:
        raw = turn_context_bytes(turn=turn)
        doc = json.loads(raw)
    except (NotFound, ValueError):
        view.error = ERR_CONTEXT_MISSING
        return view
    named = Counter(
        ref.get("id")
        for earlier in doc.get("turns", [])
        for ref in earlier.get("artifact_refs", [])
        if isinstance(ref.get("id"), int)
    )
    view.refs = list(named.items())
    view.segments = highlight_refs(raw.decode("utf-8"))
    view.topic = str((doc.get("round") or {}).get("topic", ""))
    view.shown = [
        (
            str((earlier.get("speaker") or {}).get("name", "")),
            [
                str(ref.get("title") or "untitled")
                for ref in earlier.get("artifact_refs", [])
            ],
        )
        for earlier in doc.get("turns", [])
    ]
    view.earlier = [
        {
            "number": past.get("number"),
            "topic": str(past.get("topic", "")),
            "outcome": str((past.get("outcome") or {}).get("text", "")),
        }
        for past in doc.get("earlier_rounds", [])
    ]
    return view


def round_page(*, council_round: CouncilRound) -> list[TurnView]:
    """Everything the round viewer shows, turn by turn, in a fixed number of queries."""
    views = []
    turns = list(round_turns(council_round))
    # Who made each artifact in this round, for the citations that name it.
    authors = {
        link.artifact_id: turn.participant.name
        for turn in turns
        for link in turn.artifact_links.all()
        if link.role == TurnArtifact.Role.PRODUCED
    }
    for turn in turns:
        view = TurnView(turn=turn, brain=brain_label(turn.participant.brain))
        preview_ids = set()
        for link in turn.artifact_links.all():
            artifact = link.artifact
            if link.role == TurnArtifact.Role.CONTEXT:
                view.context_artifact = artifact
            elif link.role == TurnArtifact.Role.CITED:
                view.cited.append(Citation(artifact, authors.get(artifact.pk, "")))
            elif artifact.media_type in WIDGET_MEDIA_TYPES:
                status = preview_status(artifact)
                ok = status.get("status") == STATUS_OK
                preview_ids.add(status.get("artifact_id"))
                reason = status.get("reason") or (
                    "" if ok else "no preview was rendered"
                )
                view.widgets.append(WidgetView(artifact, ok, reason))
        views.append(view)
    return views


def live_context(*, council_round: CouncilRound, participant: Participant) -> dict:
    """The context ``participant`` would receive if they spoke next (read-only)."""
    return serialize_branch_context(council_round, participant)


def context_for(*, council_round: CouncilRound, participant_id=None) -> dict:
    """The context the next speaker (or ``participant_id``) receives; 404 if none."""
    if participant_id is None:
        participant = next_participant(council_round=council_round)
        if participant is None:
            raise NotFound(ERR_NO_PARTICIPANTS)
    else:
        participant = participant_get(
            council_round=council_round, participant_id=participant_id
        )
    return live_context(council_round=council_round, participant=participant)


def rounds_of(*, conversation):
    """A conversation's council rounds in order, with their participants."""
    return conversation.council_rounds.prefetch_related("participants").order_by(
        "number"
    )


def rounds_payload(*, conversation) -> list[dict]:
    """The council rounds of a conversation with their participants, as JSON."""
    return [
        round_payload(council_round=r) for r in rounds_of(conversation=conversation)
    ]


def round_payload(*, council_round: CouncilRound) -> dict:
    return {
        "id": council_round.pk,
        "number": council_round.number,
        "topic": council_round.topic,
        "outcome": outcome_document(council_round),
        "participants": [
            {"id": p.pk, "name": p.name, "brain": p.brain, "position": p.position}
            for p in council_round.participants.all()
        ],
    }
