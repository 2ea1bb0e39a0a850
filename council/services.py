"""Council rounds: start a round, add turns, serialize the branch context.

The horizontal axis (docs/design.md, "The council and its refs"): when a
participant renders a widget, the next speakers receive a *ref* to it in
``artifact_refs[]`` (``participant_ref``: ``tasks.documents.artifact_ref``'s
id, sha256, artifact_class, class_label, media type, title, size; plus source
URL, preview URL, source_refs), never the payload. A receiver chooses to read the
SVG source or the PNG preview through the artifact endpoints. Reading is read-only: no lease, no state change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.db import transaction
from django.db.models import Max, Prefetch

from artifacts.models import Artifact, ArtifactClass
from artifacts.preview import (
    PREVIEW_MEDIA_TYPE,
    STATUS_OK,
    WIDGET_MEDIA_TYPES,
    preview_render,
    preview_status,
)
from artifacts.selectors import artifact_user_may_see
from artifacts.services import artifact_store
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from pippa_site.errors import Invalid
from pippa_site.text import (
    TITLE_MAX,
    TextError,
    bidi_strip,
    text_check,
    title_clean,
)
from tasks.documents import artifact_content_url, artifact_ref
from tasks.models import Brain, Conversation

CONTEXT_SCHEMA = "pippa.council.context/1"
CONTEXT_MEDIA_TYPE = "application/json"
CONTEXT_NOTE = (
    "Earlier turns of this council round, oldest first. Artifacts are refs, "
    "never payloads: GET source_url for an artifact's raw bytes (for a widget, "
    "its SVG source) or preview_url for a PNG preview, with the bearer token "
    "you read this with (the JSON API); over MCP, call artifact_read with the "
    "id. Cite an artifact by id."
)
MAX_WIDGET_BYTES = 16 * 1024 * 1024

ERR_NO_PARTICIPANTS = "a round needs at least one participant"
ERR_DUPLICATE_PARTICIPANT = "participant names must be unique within a round"
ERR_WRONG_ROUND = "that participant does not belong to this round"
ERR_WIDGET_MEDIA_TYPE = "a widget must be SVG (image/svg+xml) or HTML (text/html)"
ERR_WIDGET_TOO_LARGE = "a widget may be at most 16 MiB"
ERR_UNKNOWN_CITE = "a cited artifact does not exist or is not visible in this round"
ERR_EMPTY_TURN = "a turn needs text or a widget"


class CouncilError(Invalid):
    """A council request that cannot be (400 at a door)."""


def _text_check(*values: str) -> None:
    try:
        for value in values:
            text_check(value or "")
    except TextError as exc:
        raise CouncilError(str(exc)) from None


def brain_label(brain: str) -> str:
    """Return the display name of a brain ("claude" -> "Claude"); others as given."""
    try:
        return Brain(brain).label
    except ValueError:
        return brain


@transaction.atomic
def round_start(
    *,
    conversation: Conversation,
    topic: str,
    participants: Sequence[tuple[str, str]],
) -> CouncilRound:
    """Start the next round of a conversation with (name, brain) participants."""
    if not participants:
        raise CouncilError(ERR_NO_PARTICIPANTS)
    _text_check(topic, *(f"{name}{brain}" for name, brain in participants))
    topic = title_clean(topic)
    names = [title_clean(name).strip()[:100] for name, _ in participants]
    if len(set(names)) != len(names) or not all(names):
        raise CouncilError(ERR_DUPLICATE_PARTICIPANT)
    # Lock the conversation row so two starts cannot pick the same number.
    Conversation.objects.select_for_update().filter(pk=conversation.pk).first()
    last = CouncilRound.objects.filter(conversation=conversation).aggregate(
        n=Max("number")
    )["n"]
    council_round = CouncilRound.objects.create(
        conversation=conversation, number=(last or 0) + 1, topic=topic[:TITLE_MAX]
    )
    Participant.objects.bulk_create(
        [
            Participant(
                round=council_round,
                name=name,
                brain=(brain or Brain.OTHER)[:40],
                position=i,
            )
            for i, (name, (_, brain)) in enumerate(
                zip(names, participants, strict=True)
            )
        ]
    )
    return council_round


# -- artifact refs and the branch context -------------------------------------


def participant_ref(artifact: Artifact, *, role: str | None = None) -> dict:
    """Return the ref a participant receives for ``artifact``: metadata and URLs only.

    The ref of ``tasks.documents.artifact_ref``, plus where to read the source
    and the preview (the JSON API's content address, which the bearer token
    the participant reads its context with reaches; never a dashboard page,
    which would send a token to the login form), and the sources it was made
    from (``council.shapes.ParticipantRef``).
    """
    status = preview_status(artifact)
    preview_url = None
    preview: dict | None = None
    if artifact.media_type == PREVIEW_MEDIA_TYPE:
        preview_url = artifact_content_url(artifact.pk)
    elif artifact.media_type in WIDGET_MEDIA_TYPES:
        if status.get("status") == STATUS_OK:
            preview_url = artifact_content_url(status["artifact_id"])
            preview = {
                "status": STATUS_OK,
                "id": status.get("artifact_id"),
                "sha256": status.get("sha256"),
            }
        elif status:
            preview = {"status": status.get("status"), "reason": status.get("reason")}
    ref = {
        **artifact_ref(artifact),
        "source_url": artifact_content_url(artifact.pk),
        "preview_url": preview_url,
        "source_refs": [
            {"id": link.source_id, "sha256": link.source.sha256}
            for link in artifact.source_links.all()
        ],
    }
    if preview is not None:
        ref["preview"] = preview
    if role is not None:
        ref["role"] = role
    return ref


def _turn_refs(turn: Turn) -> list[dict]:
    """Refs of a turn's produced and cited artifacts, widget previews folded in."""
    links = [
        link
        for link in turn.artifact_links.all()
        if link.role in (TurnArtifact.Role.PRODUCED, TurnArtifact.Role.CITED)
    ]
    shown_previews = {
        preview_status(link.artifact).get("artifact_id")
        for link in links
        if link.role == TurnArtifact.Role.PRODUCED
    }
    refs = []
    for link in sorted(links, key=lambda x: (x.role != "produced", x.pk)):
        if link.role == TurnArtifact.Role.PRODUCED and link.artifact_id in (
            shown_previews - {None}
        ):
            continue  # reachable through its widget's preview_url
        refs.append(participant_ref(link.artifact, role=link.role))
    return refs


def round_turns(council_round: CouncilRound, *, with_sources: bool = False):
    """A round's turns in order, with speakers and artifact links in a fixed
    number of queries; ``with_sources`` also loads each artifact's sources
    (a context's refs name them)."""
    links = TurnArtifact.objects.select_related("artifact").order_by("id")
    if with_sources:
        links = links.prefetch_related("artifact__source_links__source")
    return (
        Turn.objects.filter(round=council_round)
        .select_related("participant")
        .prefetch_related(Prefetch("artifact_links", queryset=links))
        .order_by("order")
    )


def _turns_before(council_round: CouncilRound, before_order: int | None):
    turns = round_turns(council_round, with_sources=True)
    if before_order is not None:
        turns = turns.filter(order__lt=before_order)
    return turns


def serialize_branch_context(
    council_round: CouncilRound,
    next_participant: Participant,
    *,
    before_order: int | None = None,
) -> dict:
    """Return the JSON document the next participant receives.

    It holds the earlier turns' text and ``artifact_refs[]``; widget payloads
    are never inlined, so its size does not depend on the widgets' sizes. The
    document has one shape for every brain. ``before_order`` limits it to the
    turns before that order (how a past turn's context is reproduced).
    """
    if next_participant.round_id != council_round.pk:
        raise CouncilError(ERR_WRONG_ROUND)
    turns = []
    for turn in _turns_before(council_round, before_order):
        turns.append(
            {
                "order": turn.order,
                "speaker": {
                    "name": turn.participant.name,
                    "brain": turn.participant.brain,
                },
                "text": turn.text,
                "artifact_refs": _turn_refs(turn),
            }
        )
    return {
        "schema": CONTEXT_SCHEMA,
        "note": CONTEXT_NOTE,
        "round": {
            "id": council_round.pk,
            "number": council_round.number,
            "topic": council_round.topic,
            "conversation_id": council_round.conversation_id,
        },
        "for": {"name": next_participant.name, "brain": next_participant.brain},
        "turns": turns,
    }


def context_bytes(context: dict) -> bytes:
    """Serialize a context document the one way it is stored and served."""
    return json.dumps(context, ensure_ascii=False, indent=1, sort_keys=False).encode(
        "utf-8"
    )


# -- turns --------------------------------------------------------------------


def widget_store(
    *,
    owner,
    data: bytes,
    media_type: str = "image/svg+xml",
    title: str = "",
    source_ids: Sequence[int] = (),
) -> tuple[Artifact, Artifact | None]:
    """Store a widget as a class-4 artifact and render its PNG preview now.

    Returns (widget, preview or None). A failed preview never loses the
    widget: the reason is recorded in the widget's ``meta["preview"]``.
    """
    if media_type not in WIDGET_MEDIA_TYPES:
        raise CouncilError(ERR_WIDGET_MEDIA_TYPE)
    if len(data) > MAX_WIDGET_BYTES:
        raise CouncilError(ERR_WIDGET_TOO_LARGE)
    widget = artifact_store(
        owner=owner,
        data=data,
        media_type=media_type,
        artifact_class=ArtifactClass.RENDER,
        title=title or "Widget",
        source_ids=source_ids,
    )
    preview = preview_render(artifact=widget)
    widget.refresh_from_db(fields=["meta"])
    return widget, preview


def turn_add(
    *,
    council_round: CouncilRound,
    participant: Participant,
    text: str,
    widget: bytes | None = None,
    widget_media_type: str = "image/svg+xml",
    widget_title: str = "",
    widget_source_ids: Sequence[int] = (),
    cites: Sequence[int] = (),
) -> Turn:
    """Record a participant's turn, with its widget and what it cites.

    1. Check the participant, the text (bidi controls are stripped, as
       from titles) and the cited artifact ids (each must be visible to the
       conversation's owner).
    2. Store the widget and render its preview (outside any transaction: the
       render may take seconds and must not hold the write lock).
    3. In one transaction: lock the round, take the next order, serialize the
       context the speaker received (turns before this one only), store it as
       a small JSON artifact, create the turn and its links: ``produced`` for
       the widget and its preview, ``cited`` for citations, ``context`` for
       the context. These links are what keep the artifacts alive.
    """
    if participant.round_id != council_round.pk:
        raise CouncilError(ERR_WRONG_ROUND)
    _text_check(text, widget_title, widget_media_type)
    # Like a title, a turn's text must not flip what follows it on a page.
    text = bidi_strip(text)
    if not text.strip() and widget is None:
        raise CouncilError(ERR_EMPTY_TURN)
    owner = council_round.conversation.owner
    cite_ids = list(dict.fromkeys(int(c) for c in cites))
    for cite_id in cite_ids:
        if not artifact_user_may_see(user=owner, artifact_id=cite_id):
            raise CouncilError(ERR_UNKNOWN_CITE)
    produced: list[Artifact] = []
    if widget is not None:
        widget_artifact, preview = widget_store(
            owner=owner,
            data=widget,
            media_type=widget_media_type,
            title=widget_title,
            source_ids=widget_source_ids,
        )
        produced.append(widget_artifact)
        if preview is not None:
            produced.append(preview)
    return _turn_commit(
        council_round=council_round,
        participant=participant,
        text=text,
        produced=produced,
        cite_ids=cite_ids,
    )


@transaction.atomic
def _turn_commit(
    *,
    council_round: CouncilRound,
    participant: Participant,
    text: str,
    produced: list[Artifact],
    cite_ids: list[int],
) -> Turn:
    CouncilRound.objects.select_for_update().filter(pk=council_round.pk).first()
    last = Turn.objects.filter(round=council_round).aggregate(n=Max("order"))["n"]
    order = (last or 0) + 1
    context = serialize_branch_context(council_round, participant, before_order=order)
    context_artifact = artifact_store(
        owner=council_round.conversation.owner_id,
        data=context_bytes(context),
        media_type=CONTEXT_MEDIA_TYPE,
        artifact_class=ArtifactClass.SNAPSHOT,
        title=f"Context received by {participant.name} "
        f"(round {council_round.number}, turn {order})",
    )
    turn = Turn.objects.create(
        round=council_round, participant=participant, order=order, text=text
    )
    links = [
        TurnArtifact(turn=turn, artifact=a, role=TurnArtifact.Role.PRODUCED)
        for a in produced
    ]
    links += [
        TurnArtifact(turn=turn, artifact_id=cid, role=TurnArtifact.Role.CITED)
        for cid in cite_ids
    ]
    links.append(
        TurnArtifact(
            turn=turn, artifact=context_artifact, role=TurnArtifact.Role.CONTEXT
        )
    )
    TurnArtifact.objects.bulk_create(links)
    return turn
