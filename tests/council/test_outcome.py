"""A council round's outcome: written by its last speaker or by its owner,
shown first on its page, and read by the next round's participants through
their context, with refs to what the earlier round made."""

from __future__ import annotations

import pytest
from django.urls import reverse

from council.models import CouncilRound
from council.selectors import context_for, round_payload
from council.services import (
    ERR_NOBODY_SPOKE,
    CouncilError,
    round_conclude,
    round_start,
    serialize_branch_context,
    turn_add,
)

pytestmark = pytest.mark.django_db

SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="80">'
    b'<rect width="120" height="80" fill="#cfe8d5"/></svg>'
)


def test_the_last_speaker_concludes_the_round_and_it_takes_no_more_turns(council):
    council_round, ada, kit = council
    turn_add(council_round=council_round, participant=ada, text="Flooding first.")
    turn_add(council_round=council_round, participant=kit, text="Agreed.")

    with pytest.raises(CouncilError, match=r"only the round's last speaker \(Kit\)"):
        round_conclude(
            council_round=council_round, outcome="x", actor="", participant=ada
        )
    concluded = round_conclude(
        council_round=council_round,
        outcome="  Check the sump pump this month.  ",
        actor="",
        participant=kit,
    )

    assert concluded.outcome == "Check the sump pump this month."
    assert concluded.concluded_by == "participant:Kit"
    assert concluded.is_concluded
    with pytest.raises(CouncilError, match="is concluded"):
        turn_add(council_round=council_round, participant=ada, text="One more")
    with pytest.raises(CouncilError, match="already concluded"):
        round_conclude(
            council_round=council_round, outcome="again", actor="", participant=kit
        )


def test_nobody_concludes_a_round_nobody_spoke_in_nor_with_no_words(council):
    council_round, ada, _ = council
    with pytest.raises(CouncilError, match=ERR_NOBODY_SPOKE):
        round_conclude(
            council_round=council_round, outcome="x", actor="", participant=ada
        )
    turn_add(council_round=council_round, participant=ada, text="Flooding first.")
    for empty in ("", "   ", "\u202e"):
        with pytest.raises(CouncilError, match="needs words"):
            round_conclude(council_round=council_round, outcome=empty, actor="user:dad")
    assert not CouncilRound.objects.get(pk=council_round.pk).is_concluded


def test_the_next_rounds_participants_read_the_outcome_and_refs_to_what_was_made(
    council,
):
    council_round, ada, kit = council
    turn_add(
        council_round=council_round,
        participant=ada,
        text="Here is the map.",
        widget=SVG,
        widget_title="Risk map",
    )
    turn_add(council_round=council_round, participant=kit, text="Agreed.")
    open_round = context_for(council_round=council_round)
    assert open_round["round"]["outcome"] is None
    round_conclude(
        council_round=council_round,
        outcome="Flooding first.",
        actor="",
        participant=kit,
    )
    second = round_start(
        conversation=council_round.conversation,
        topic="How to pay for it?",
        participants=[("Grace", "gemini")],
    )
    grace = second.participants.get()

    context = serialize_branch_context(second, grace)

    [earlier] = context["earlier_rounds"]
    assert earlier["number"] == 1
    assert earlier["outcome"]["text"] == "Flooding first."
    assert earlier["outcome"]["by"] == "participant:Kit"
    [ref] = earlier["artifact_refs"]
    assert ref["title"] == "Risk map"
    assert ref["preview_url"]  # the same refs a turn's context carries
    # Grace may cite it by id in her turn.
    turn = turn_add(
        council_round=second, participant=grace, text="Using it.", cites=[ref["id"]]
    )
    assert turn.artifact_links.filter(artifact_id=ref["id"], role="cited").exists()


def test_dad_concludes_or_rewords_his_own_rounds_only(
    council, dad_client, make_user, client
):
    council_round, ada, _ = council
    turn_add(council_round=council_round, participant=ada, text="Flooding first.")
    url = reverse("council:round_conclude", args=[council_round.pk])

    page = dad_client.post(url, {"outcome": "Sump pump this month."}, follow=True)
    text = page.content.decode()
    assert "Round 1 is concluded" in text
    assert "Sump pump this month." in text
    assert "Written by <bdi>dad</bdi>" in text
    dad_client.post(url, {"outcome": "Sump pump and insurance."})
    council_round.refresh_from_db()
    assert council_round.outcome == "Sump pump and insurance."
    assert council_round.concluded_by == "user:dad"

    client.force_login(make_user(username="neighbour"))
    assert client.post(url, {"outcome": "Mine now"}).status_code == 404
    assert client.get(council_round.get_absolute_url()).status_code == 404
    council_round.refresh_from_db()
    assert council_round.outcome == "Sump pump and insurance."


def test_an_empty_outcome_from_the_page_saves_nothing_and_says_why(council, dad_client):
    council_round, ada, _ = council
    turn_add(council_round=council_round, participant=ada, text="Flooding first.")
    page = dad_client.post(
        reverse("council:round_conclude", args=[council_round.pk]),
        {"outcome": "  "},
        follow=True,
    )
    assert "Nothing was saved: an outcome needs words" in page.content.decode()
    assert not CouncilRound.objects.get(pk=council_round.pk).is_concluded


def test_an_open_round_says_no_conclusion_yet_and_offers_to_write_one(
    council, dad_client
):
    council_round, ada, _ = council
    turn_add(council_round=council_round, participant=ada, text="Flooding first.")
    body = dad_client.get(council_round.get_absolute_url()).content.decode()
    assert "<strong>No conclusion yet.</strong>" in body
    assert "Write the outcome and close the round…" in body
    assert body.index("No conclusion yet") < body.index('id="participants-h"')


def test_the_api_and_mcp_rounds_carry_the_outcome(council):
    council_round, ada, kit = council
    assert round_payload(council_round=council_round)["outcome"] is None
    turn_add(council_round=council_round, participant=kit, text="Agreed.")
    round_conclude(
        council_round=council_round, outcome="Done.", actor="", participant=kit
    )
    assert round_payload(council_round=council_round)["outcome"]["text"] == "Done."


def test_the_api_lists_a_rounds_outcome_to_its_owner_only(
    council, client, user, make_user
):
    from api.services import token_create

    council_round, _, kit = council
    turn_add(council_round=council_round, participant=kit, text="Agreed.")
    round_conclude(
        council_round=council_round, outcome="Done.", actor="", participant=kit
    )
    url = f"/api/v1/conversations/{council_round.conversation_id}/council"
    mine = token_create(user=user, name="runner").raw
    theirs = token_create(user=make_user(username="mallory"), name="runner").raw

    listed = client.get(url, headers={"Authorization": f"Bearer {mine}"}).json()
    refused = client.get(url, headers={"Authorization": f"Bearer {theirs}"})

    assert listed[0]["outcome"]["text"] == "Done."
    assert refused.status_code == 404


def test_an_agent_concludes_as_the_last_speaker_over_mcp_and_nobody_elses_round(
    council, user, make_user
):
    from mcp.server.mcpserver.exceptions import ToolError

    from pippa_mcp import server
    from pippa_mcp.server import acting_as

    council_round, ada, kit = council
    with acting_as(user):
        server.council_turn_add(
            round_id=council_round.pk, participant_id=kit.pk, text="Agreed."
        )
        with pytest.raises(ToolError, match="only the round's last speaker"):
            server.council_round_conclude(
                round_id=council_round.pk, participant_id=ada.pk, outcome="Mine"
            )
    with acting_as(make_user(username="mallory")), pytest.raises(ToolError) as theirs:
        server.council_round_conclude(
            round_id=council_round.pk, participant_id=kit.pk, outcome="Mallory's"
        )
    assert str(theirs.value) == "No such council round."
    with acting_as(user):
        done = server.council_round_conclude(
            round_id=council_round.pk, participant_id=kit.pk, outcome="Flooding first."
        )
        context = server.council_context(round_id=council_round.pk)

    assert done["outcome"]["text"] == "Flooding first."
    assert context["round"]["outcome"]["by"] == "participant:Kit"
