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
from django.utils import timezone

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
    "Earlier turns of this council round, oldest first, and the outcomes of the "
    "rounds before it (earlier_rounds, with refs to what they made). Artifacts "
    "are refs, never payloads: GET source_url for an artifact's raw bytes (for a "
    "widget, its SVG source) or preview_url for a PNG preview, with the bearer "
    "token you read this with (the JSON API); over MCP, call artifact_read with "
    "the id. Cite an artifact by id. The last speaker may conclude the round "
    "with its outcome."
)
MAX_WIDGET_BYTES = 16 * 1024 * 1024

ERR_NO_PARTICIPANTS = "a round needs at least one participant"
ERR_DUPLICATE_PARTICIPANT = "participant names must be unique within a round"
ERR_WRONG_ROUND = "that participant does not belong to this round"
ERR_WIDGET_MEDIA_TYPE = "a widget must be SVG (image/svg+xml) or HTML (text/html)"
ERR_WIDGET_TOO_LARGE = "a widget may be at most 16 MiB"
ERR_UNKNOWN_CITE = "a cited artifact does not exist or is not visible in this round"
ERR_EMPTY_TURN = "a turn needs text or a widget"
ERR_ROUND_CONCLUDED = (
    "round {number} is concluded (“{outcome}”): start the next round to go on"
)
ERR_OUTCOME_EMPTY = "an outcome needs words: what they agreed, or what to do next"
ERR_NOT_LAST_SPEAKER = (
    "only the round's last speaker ({name}) may conclude it; a participant who"
    " has not spoken last takes a turn instead"
)
ERR_NOBODY_SPOKE = "nobody has spoken in this round yet: there is nothing to conclude"
ERR_ALREADY_CONCLUDED = "round {number} is already concluded; its owner may reword it"
MAX_OUTCOME_CHARS = 4000
# What one round and one turn may hold, whichever door asks (MCP reads these
# for its schema; the service refuses past them).
PARTICIPANTS_MAX = 20
PARTICIPANT_NAME_MAX = Participant._meta.get_field("name").max_length
BRAIN_NAME_MAX = Participant._meta.get_field("brain").max_length
TURN_TEXT_MAX = 20_000
CITES_MAX = 50
ERR_TOO_MANY_PARTICIPANTS = f"a round has at most {PARTICIPANTS_MAX} participants"
ERR_TURN_TOO_LONG = (
    f"a turn's text is at most {TURN_TEXT_MAX:,} characters, not {{length:,}}:"
    " say it shorter, or put the long part in a widget or an artifact and cite it"
)
ERR_TOO_MANY_CITES = f"a turn cites at most {CITES_MAX} artifacts, not {{count}}"
# How many earlier rounds a participant's context recalls (their outcomes and
# what they made), and how many refs each: bounded whatever the conversation's length.
CONTEXT_EARLIER_ROUNDS = 3
CONTEXT_EARLIER_REFS = 10


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
    """Start the next round of a conversation with (name, brain) participants
    (at most ``PARTICIPANTS_MAX``)."""
    if not participants:
        raise CouncilError(ERR_NO_PARTICIPANTS)
    if len(participants) > PARTICIPANTS_MAX:
        raise CouncilError(ERR_TOO_MANY_PARTICIPANTS)
    _text_check(topic, *(f"{name}{brain}" for name, brain in participants))
    topic = title_clean(topic)
    names = [
        title_clean(name).strip()[:PARTICIPANT_NAME_MAX] for name, _ in participants
    ]
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
                brain=(brain or Brain.OTHER)[:BRAIN_NAME_MAX],
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
            "outcome": outcome_document(council_round),
        },
        "for": {"name": next_participant.name, "brain": next_participant.brain},
        "earlier_rounds": _earlier_rounds(council_round),
        "turns": turns,
    }


def outcome_document(council_round: CouncilRound) -> dict | None:
    """A round's outcome as its context and its doors give it; None while open."""
    if not council_round.is_concluded:
        return None
    return {
        "text": council_round.outcome,
        "by": council_round.concluded_by,
        "at": council_round.concluded_at.isoformat(),
    }


def _earlier_rounds(council_round: CouncilRound) -> list[dict]:
    """The conversation's rounds before this one (the last few, oldest first):
    their topic, their outcome, and refs to what their turns made, so a new
    round starts from where the last one got to, through the same refs."""
    earlier = list(
        CouncilRound.objects.filter(
            conversation_id=council_round.conversation_id,
            number__lt=council_round.number,
        ).order_by("-number")[:CONTEXT_EARLIER_ROUNDS]
    )
    recalled = []
    for past in reversed(earlier):
        refs: list[dict] = []
        for turn in round_turns(past, with_sources=True):
            refs += [r for r in _turn_refs(turn) if r.get("role") == "produced"]
        recalled.append(
            {
                "number": past.number,
                "topic": past.topic,
                "outcome": outcome_document(past),
                "artifact_refs": refs[:CONTEXT_EARLIER_REFS],
            }
        )
    return recalled


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
       from titles; at most ``TURN_TEXT_MAX`` characters) and the cited
       artifact ids (at most ``CITES_MAX``, each visible to the
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
    _refuse_concluded(council_round)
    _text_check(text, widget_title, widget_media_type)
    # Like a title, a turn's text must not flip what follows it on a page.
    text = bidi_strip(text)
    if not text.strip() and widget is None:
        raise CouncilError(ERR_EMPTY_TURN)
    if len(text) > TURN_TEXT_MAX:
        raise CouncilError(ERR_TURN_TOO_LONG.format(length=len(text)))
    owner = council_round.conversation.owner
    cite_ids = list(dict.fromkeys(int(c) for c in cites))
    if len(cite_ids) > CITES_MAX:
        raise CouncilError(ERR_TOO_MANY_CITES.format(count=len(cite_ids)))
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
    locked = CouncilRound.objects.select_for_update().get(pk=council_round.pk)
    _refuse_concluded(locked)
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


def _refuse_concluded(council_round: CouncilRound) -> None:
    if council_round.is_concluded:
        raise CouncilError(
            ERR_ROUND_CONCLUDED.format(
                number=council_round.number,
                outcome=council_round.outcome[:80]
                + ("…" if len(council_round.outcome) > 80 else ""),
            )
        )


# -- the outcome ------------------------------------------------------------------


@transaction.atomic
def round_conclude(
    *,
    council_round: CouncilRound,
    outcome: str,
    actor: str,
    participant: Participant | None = None,
) -> CouncilRound:
    """Close a round with its outcome: what was agreed, or what to do next.

    1. Check the words (bidi controls stripped, as from a turn; at most
       ``MAX_OUTCOME_CHARS``).
    2. Lock the round. A participant (``participant``) concludes only a round
       still open, and only as its last speaker: the one who had the last
       word sums it up. The round's owner (no ``participant``: the dashboard)
       may conclude it at any time, and reword an outcome already written.
    3. Write the outcome, when and by whom. The round then takes no more
       turns; the next round's participants receive the outcome in their
       context (``earlier_rounds``).
    """
    _text_check(outcome)
    words = bidi_strip(str(outcome)).strip()
    if not words:
        raise CouncilError(ERR_OUTCOME_EMPTY)
    words = words[:MAX_OUTCOME_CHARS]
    locked = CouncilRound.objects.select_for_update().get(pk=council_round.pk)
    if participant is not None:
        if participant.round_id != locked.pk:
            raise CouncilError(ERR_WRONG_ROUND)
        if locked.is_concluded:
            raise CouncilError(ERR_ALREADY_CONCLUDED.format(number=locked.number))
        last = (
            Turn.objects.filter(round=locked)
            .select_related("participant")
            .order_by("-order")
            .first()
        )
        if last is None:
            raise CouncilError(ERR_NOBODY_SPOKE)
        if last.participant_id != participant.pk:
            raise CouncilError(ERR_NOT_LAST_SPEAKER.format(name=last.participant.name))
        actor = f"participant:{participant.name}"
    CouncilRound.objects.filter(pk=locked.pk).update(
        outcome=words, concluded_at=timezone.now(), concluded_by=str(actor)[:200]
    )
    council_round.refresh_from_db()
    return council_round
