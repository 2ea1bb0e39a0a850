"""A council round with two participants (Ada, then Kit), owned by ``user``."""

from __future__ import annotations

import pytest

from council.services import round_start


@pytest.fixture
def council(make_conversation, user):
    conversation = make_conversation(owner=user, title="Household")
    council_round = round_start(
        conversation=conversation,
        topic="Which risks first?",
        participants=[("Ada", "claude"), ("Kit", "kimi")],
    )
    ada, kit = council_round.participants.order_by("position")
    return council_round, ada, kit
