"""A council turn's limits live in council.services: every door refuses past
them, and the MCP tool's schema states the same numbers."""

from __future__ import annotations

import pytest
from mcp.client import Client
from mcp.server.mcpserver.exceptions import ToolError

from council.models import Turn
from council.services import (
    CITES_MAX,
    PARTICIPANTS_MAX,
    TURN_TEXT_MAX,
    CouncilError,
    round_start,
    turn_add,
)
from pippa_mcp import server
from pippa_mcp.server import acting_as
from tests.support.asyncrun import run_async

pytestmark = pytest.mark.django_db


def test_a_turn_longer_than_the_limit_is_refused_by_the_service_and_nothing_is_kept(
    council,
):
    council_round, ada, _ = council

    with pytest.raises(CouncilError, match="at most 20,000 characters, not 20,001"):
        turn_add(
            council_round=council_round,
            participant=ada,
            text="x" * (TURN_TEXT_MAX + 1),
        )
    kept = turn_add(
        council_round=council_round, participant=ada, text="x" * TURN_TEXT_MAX
    )

    assert list(Turn.objects.filter(round=council_round)) == [kept]


def test_mcp_refuses_a_long_turn_the_same_way_through_its_tool_and_its_schema(
    council, user
):
    council_round, ada, _ = council
    too_long = "x" * (TURN_TEXT_MAX + 1)
    args = {"round_id": council_round.pk, "participant_id": ada.pk, "text": too_long}

    # The tool as a function (what the guard passes on): the service's sentence.
    with acting_as(user), pytest.raises(ToolError) as direct:
        server.council_turn_add(**args)

    # Over the protocol: the schema, from the same constant, refuses first.
    async def over_protocol():
        with acting_as(user):
            async with Client(server.server) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                return tools, await client.call_tool("council_turn_add", args)

    tools, answer = run_async(over_protocol)

    assert "at most 20,000 characters" in str(direct.value)
    assert answer.is_error
    assert "text" in answer.content[0].text
    schema = tools["council_turn_add"].input_schema["properties"]
    assert schema["text"]["maxLength"] == TURN_TEXT_MAX
    assert schema["cites"]["maxItems"] == CITES_MAX
    start = tools["council_round_start"].input_schema["properties"]
    assert start["participants"]["maxItems"] == PARTICIPANTS_MAX
    assert not Turn.objects.filter(round=council_round).exists()


def test_a_round_of_too_many_participants_and_a_turn_citing_too_many_are_refused(
    council, make_conversation, user, make_artifact
):
    council_round, ada, _ = council
    conversation = make_conversation(owner=user, title="Crowd")
    crowd = [(f"P{i}", "other") for i in range(PARTICIPANTS_MAX + 1)]

    with pytest.raises(CouncilError, match=f"at most {PARTICIPANTS_MAX} participants"):
        round_start(conversation=conversation, topic="All of us", participants=crowd)
    cited = [
        make_artifact(owner=user, data=f"a{i}".encode()).pk
        for i in range(CITES_MAX + 1)
    ]
    with pytest.raises(CouncilError, match=f"cites at most {CITES_MAX} artifacts"):
        turn_add(council_round=council_round, participant=ada, text="See", cites=cited)

    assert not conversation.council_rounds.exists()
    assert not Turn.objects.filter(round=council_round).exists()
