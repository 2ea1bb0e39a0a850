"""MCP tools for council rounds: start, list, read the context, speak, conclude."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver.exceptions import (
    ToolError,
)
from pydantic import Field

from artifacts.services import MAX_SOURCES
from council.models import TurnArtifact
from council.selectors import (
    context_for,
    participant_get,
    round_get_for_user,
    round_payload,
    rounds_of,
)
from council.services import (
    CITES_MAX,
    MAX_OUTCOME_CHARS,
    PARTICIPANTS_MAX,
    TURN_TEXT_MAX,
    participant_ref,
    round_conclude,
)
from council.services import round_start as council_round_create
from council.services import turn_add as council_turn_create
from council.shapes import CouncilContext, RoundOut
from pippa_mcp.answers import cursor_after, cursor_read, page_message, page_of
from pippa_mcp.arguments import (
    MAX_STORE_BYTES,
    PAGE_ROWS,
    Cursor,
    Id,
    Limit,
    Participant,
    as_models,
)
from pippa_mcp.door import current_user, tool
from pippa_mcp.shapes import (
    RoundPage,
    TurnAdded,
)
from tasks.documents import (
    artifacts_get,
    conversation_get_for_user,
)
from tasks.shapes import (
    Title,
    TitleOrEmpty,
)

ERR_NO_WIDGET_OR_TEXT = "a turn needs text or a widget"


# -- council ----------------------------------------------------------------------


@tool(title="Start a council round")
def council_round_start(
    conversation_id: Id,
    topic: Title,
    participants: Annotated[
        list[Participant], Field(min_length=1, max_length=PARTICIPANTS_MAX)
    ],
) -> RoundOut:
    """Start the next council round of a conversation with named participants.

    Participants speak in the order given; council_context tells each one
    what the earlier speakers said and made (as refs).
    """
    conversation = conversation_get_for_user(
        user=current_user(), conversation_id=conversation_id
    )
    council_round = council_round_create(
        conversation=conversation,
        topic=topic,
        participants=[(p.name, p.brain) for p in as_models(participants, Participant)],
    )
    return round_payload(council_round=council_round)


@tool(title="List a conversation's council rounds", read_only=True)
def council_rounds(
    conversation_id: Id, cursor: Cursor = None, limit: Limit = PAGE_ROWS
) -> RoundPage:
    """List a conversation's council rounds, oldest first, with their participants' ids.

    At most limit a page; pass next_cursor as cursor for the next page.
    """
    after = cursor_read(cursor, "council_rounds")
    conversation = conversation_get_for_user(
        user=current_user(), conversation_id=conversation_id
    )
    rows = rounds_of(conversation=conversation)
    if after is not None:
        rows = rows.filter(number__gt=after)
    page, more = page_of(rows, limit)
    return RoundPage(
        rounds=[round_payload(council_round=r) for r in page],
        next_cursor=cursor_after("council_rounds", page[-1].number) if more else None,
        message=page_message(
            len(page),
            more=more,
            first=after is None,
            noun="council rounds, oldest first",
            empty=f"Conversation {conversation.pk} has no council rounds yet:"
            " council_round_start starts one.",
        ),
    )


@tool(title="Read a council round's context", read_only=True)
def council_context(round_id: Id, participant_id: Id | None = None) -> CouncilContext:
    """Return the context the next speaker of a council round receives.

    Earlier turns' text and artifact_refs[] (id, sha256, artifact_class,
    class_label, media_type, title, size, source_url, preview_url, preview
    state, source_refs): refs, never payloads. To see a widget, call
    artifact_read with its id: view='source' for the SVG markup,
    view='preview' for the PNG (source_url and preview_url are the JSON
    API's addresses of the same bytes, for an API token). Read-only.
    """
    council_round = round_get_for_user(
        user=current_user(), round_id=round_id, staff=False
    )
    return context_for(council_round=council_round, participant_id=participant_id)


@tool(title="Speak in a council round")
def council_turn_add(
    round_id: Id,
    participant_id: Id,
    text: Annotated[str, Field(max_length=TURN_TEXT_MAX)] = "",
    widget_svg: Annotated[str, Field(max_length=MAX_STORE_BYTES)] = "",
    widget_title: TitleOrEmpty = "",
    widget_source_refs: Annotated[list[Id], Field(max_length=MAX_SOURCES)] = [],  # noqa: B006
    cites: Annotated[list[Id], Field(max_length=CITES_MAX)] = [],  # noqa: B006
) -> TurnAdded:
    """Speak in a council round: your text, an optional SVG widget, and citations.

    The widget is stored as a class-4 (render) artifact and its PNG preview
    is rendered now; later speakers receive both as refs in their
    council_context. cites names artifacts (by id) you built on.
    """
    user = current_user()
    council_round = round_get_for_user(user=user, round_id=round_id, staff=False)
    participant = participant_get(
        council_round=council_round, participant_id=participant_id
    )
    if not text.strip() and not widget_svg:
        raise ToolError(ERR_NO_WIDGET_OR_TEXT)
    sources = artifacts_get(user=user, artifact_ids=widget_source_refs)
    cited = artifacts_get(user=user, artifact_ids=cites)
    turn = council_turn_create(
        council_round=council_round,
        participant=participant,
        text=text,
        widget=widget_svg.encode("utf-8") if widget_svg else None,
        widget_title=widget_title,
        widget_source_ids=[s.pk for s in sources],
        cites=[c.pk for c in cited],
    )
    produced = [
        participant_ref(link.artifact, role=link.role)
        for link in turn.artifact_links.filter(
            role=TurnArtifact.Role.PRODUCED
        ).select_related("artifact")
    ]
    return TurnAdded(
        turn_id=turn.pk,
        order=turn.order,
        round_id=council_round.pk,
        artifact_refs=produced,
    )


@tool(title="Conclude a council round", destructive=True)
def council_round_conclude(
    round_id: Id,
    participant_id: Id,
    outcome: Annotated[str, Field(min_length=1, max_length=MAX_OUTCOME_CHARS)],
) -> RoundOut:
    """Conclude a council round with its outcome, as its last speaker.

    Only the participant who took the round's last turn may; say in a few
    sentences what was agreed or what the person should do. The round then
    takes no more turns, its page shows the outcome first, and the next
    round's participants receive it in their council_context (earlier_rounds).
    """
    council_round = round_get_for_user(
        user=current_user(), round_id=round_id, staff=False
    )
    participant = participant_get(
        council_round=council_round, participant_id=participant_id
    )
    concluded = round_conclude(
        council_round=council_round,
        outcome=outcome,
        actor=f"participant:{participant.name}",
        participant=participant,
    )
    return round_payload(council_round=concluded)
