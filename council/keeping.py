"""What council rows keep and hold, told to the apps below when council is ready.

A turn's link keeps its artifact (``artifacts.keepers``); rounds, turns and
turn links are part of a conversation's delete (``tasks.services``); the
doctor checks their parents (``tasks.doctor``).
"""

from __future__ import annotations

from artifacts.keepers import Keeper, OwnerLink, register
from artifacts.models import Artifact
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from tasks.doctor import OrphanCheck, missing_sql, orphan_checks_register
from tasks.models import Conversation
from tasks.services import ConversationPart, conversation_part_register

REASON_SHARED_TURN = "used by council turn {turn} in another conversation"
MAX_LINES = 20


def _turn_lines(artifact) -> list[str]:
    links = TurnArtifact.objects.filter(artifact=artifact).select_related("turn")
    return [
        f"{link.role} by council turn {link.turn.order} (round {link.turn.round_id})"
        for link in links[:MAX_LINES]
    ]


def turn_owners(artifact, user, staff: bool = False) -> list[OwnerLink]:
    """The council turns that link ``artifact``, as ``user`` sees them (every
    one to staff with ``staff``, as the artifact's page passes)."""
    links = (
        TurnArtifact.objects.for_user(user, staff=staff)
        .filter(artifact=artifact)
        .select_related(
            "turn", "turn__participant", "turn__round", "turn__round__conversation"
        )
    )
    return [
        OwnerLink("turn", link.get_role_display(), link.turn)
        for link in links.order_by("turn__round_id", "turn__order")
    ]


def orphan_checks() -> list[OrphanCheck]:
    return [
        OrphanCheck("orphan_rounds", "council rounds whose conversation is gone",
                    CouncilRound, missing_sql(Conversation, "conversation_id")),
        OrphanCheck("orphan_participants", "council participants whose round is gone",
                    Participant, missing_sql(CouncilRound, "round_id")),
        OrphanCheck("orphan_turns", "council turns whose round is gone", Turn,
                    missing_sql(CouncilRound, "round_id")),
        OrphanCheck("orphan_participant_turns", "council turns whose participant is gone",
                    Turn, missing_sql(Participant, "participant_id")),
        OrphanCheck("orphan_turn_links", "turn links whose turn is gone", TurnArtifact,
                    missing_sql(Turn, "turn_id")),
        OrphanCheck("dangling_turn_links", "turn links whose artifact is gone",
                    TurnArtifact, missing_sql(Artifact, "artifact_id")),
    ]  # fmt: skip


def register_all() -> None:
    register(
        Keeper(
            name="turn_link",
            model=TurnArtifact,
            artifact="artifact",
            parent="turn",
            conversation="turn__round__conversation",
            noun="council turn",
            # Named by id, whether or not the turn is still there (as before).
            shared=lambda ids: {i: REASON_SHARED_TURN.format(turn=i) for i in ids},
            kept_by=_turn_lines,
            owners=turn_owners,
        )
    )
    conversation_part_register(ConversationPart("rounds", CouncilRound, "conversation"))
    conversation_part_register(ConversationPart("turns", Turn, "round__conversation"))
    conversation_part_register(
        ConversationPart("links", TurnArtifact, "turn__round__conversation")
    )
    orphan_checks_register(orphan_checks)
