from __future__ import annotations

from django.apps import AppConfig


class CouncilConfig(AppConfig):
    name = "council"

    def ready(self) -> None:
        """Tell the apps below what council rows keep and contain.

        A turn's link keeps its artifact (``artifacts.keepers``); rounds,
        turns and turn links are part of a conversation's delete
        (``tasks.services``); the doctor checks their parents
        (``tasks.doctor``).
        """
        # Models and the modules that import them load only once apps are ready.
        from artifacts.keepers import Keeper, register
        from artifacts.models import Artifact
        from council.models import CouncilRound, Participant, Turn, TurnArtifact
        from tasks.doctor import OrphanCheck, missing_sql, orphan_checks_register
        from tasks.models import Conversation
        from tasks.services import ConversationPart, conversation_part_register

        register(
            Keeper(
                name="turn_link",
                model=TurnArtifact,
                artifact="artifact",
                parent="turn",
                conversation="turn__round__conversation",
                shared="used by council turn {parent} in another conversation",
            )
        )
        conversation_part_register(
            ConversationPart("rounds", CouncilRound, "conversation")
        )
        conversation_part_register(
            ConversationPart("turns", Turn, "round__conversation")
        )
        conversation_part_register(
            ConversationPart("links", TurnArtifact, "turn__round__conversation")
        )

        def checks() -> list[OrphanCheck]:
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

        orphan_checks_register(checks)
