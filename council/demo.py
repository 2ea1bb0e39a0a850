"""The demo council round: one participant draws a risk map, the next reads it by id.

``demo_round_load(owner=…)`` is idempotent: it finds the conversation
"Council: household risk review" of that owner and returns its first round if
it already has turns; otherwise it builds the round (the ``pippa_demo``
command calls it).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from django.db import transaction

from council.models import CouncilRound, Turn
from council.services import (
    round_conclude,
    round_start,
    serialize_branch_context,
    turn_add,
)
from tasks.models import Brain, Conversation

DEMO_TITLE = "Council: household risk review"
DEMO_TOPIC = "Which household risks need action this quarter?"
DEMO_OUTCOME = (
    "Act on basement flooding first: check the sump pump and move the documents"
    " box upstairs this month. Renew the insurance before it lapses. The boiler"
    " waits for its autumn service."
)

# (label, likelihood 1-5, impact 1-5)
RISKS = [
    ("Basement flooding", 3, 5),
    ("Roof leak", 2, 4),
    ("Boiler failure", 4, 3),
    ("Laptop theft", 2, 2),
    ("Expired insurance", 1, 5),
    ("Lost passwords", 3, 3),
]


def risk_map_svg(risks: list[tuple[str, int, int]] = RISKS) -> bytes:
    """A 5×5 likelihood/impact grid with one numbered dot per risk, and the
    legend under the grid in a large font: drawn narrow (480 wide), so on a
    phone, where the picture is about 340 px wide, the legend's words are
    still 14 px."""
    cell, left, top = 76, 56, 16
    grid = 5 * cell
    legend_top = top + grid + 62
    line = 30
    height = legend_top + line * len(risks) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="480" height="{height}" '
        f'viewBox="0 0 480 {height}" font-family="sans-serif" font-size="20">',
        "<title>Household risk map</title>",
        f'<rect width="480" height="{height}" fill="#ffffff"/>',
    ]
    for row in range(5):
        for col in range(5):
            score = (col + 1) * (5 - row)
            fill = "#cfe8d5" if score < 6 else "#ffe3a3" if score < 13 else "#f6b3ad"
            parts.append(
                f'<rect x="{left + col * cell}" y="{top + row * cell}" width="{cell}" '
                f'height="{cell}" fill="{fill}" stroke="#ffffff" stroke-width="2"/>'
            )
    parts.append(
        f'<text x="{left + grid / 2}" y="{top + grid + 30}" text-anchor="middle" '
        'font-size="20">Likelihood →</text>'
    )
    parts.append(
        f'<text x="26" y="{top + grid / 2}" text-anchor="middle" font-size="20" '
        f'transform="rotate(-90 26 {top + grid / 2})">Impact →</text>'
    )
    for i, (_label, likelihood, impact) in enumerate(risks):
        cx = left + (likelihood - 0.5) * cell + (i % 2) * 18 - 9
        cy = top + (5 - impact + 0.5) * cell + (i % 3) * 12 - 12
        parts.append(
            f'<circle cx="{cx}" cy="{cy}" r="14" fill="#1d2330"/>'
            f'<text x="{cx}" y="{cy + 6}" text-anchor="middle" fill="#ffffff" '
            f'font-size="16" font-weight="bold">{i + 1}</text>'
        )
    for i, (label, likelihood, impact) in enumerate(risks):
        parts.append(
            f'<text x="{left - 30}" y="{legend_top + i * line}" font-size="20">'
            f"{i + 1}. {escape(label)} (likelihood {likelihood}, impact {impact})</text>"
        )
    parts.append("</svg>")
    return "".join(parts).encode("utf-8")


@transaction.atomic
def _demo_round_shell(*, owner) -> tuple[CouncilRound, bool]:
    conversation = (
        Conversation.objects.filter(owner=owner, title=DEMO_TITLE)
        .order_by("pk")
        .first()
    )
    if conversation is None:
        conversation = Conversation.objects.create(owner=owner, title=DEMO_TITLE)
    council_round = (
        CouncilRound.objects.filter(conversation=conversation)
        .order_by("number")
        .first()
    )
    if council_round is not None:
        return council_round, Turn.objects.filter(round=council_round).exists()
    council_round = round_start(
        conversation=conversation,
        topic=DEMO_TOPIC,
        participants=[
            ("Ada", Brain.CLAUDE),
            ("Grace", Brain.GEMINI),
            ("Kit", Brain.KIMI),
        ],
    )
    return council_round, False


def demo_round_load(*, owner) -> CouncilRound:
    """Return the owner's demo round, building it the first time.

    1. Ada (Claude) renders a risk-map widget: stored as a class-4 artifact
       with its PNG preview.
    2. Grace (Gemini) receives the branch context, reads the widget's ref by
       id from ``artifact_refs[]`` and cites it in her turn.
    3. Kit (Kimi) agrees, citing the same widget, so the page shows a context
       with two earlier turns, and concludes the round with its outcome.
    """
    council_round, has_turns = _demo_round_shell(owner=owner)
    if has_turns:
        return council_round
    ada, grace, kit = list(council_round.participants.order_by("position"))
    turn_add(
        council_round=council_round,
        participant=ada,
        text=(
            "I scored six household risks by likelihood and impact and drew them "
            "on a risk map. Basement flooding and boiler failure sit in the red "
            "and amber cells."
        ),
        widget=risk_map_svg(),
        widget_title="Household risk map",
    )
    # Grace reads the widget by id from the context she receives.
    context = serialize_branch_context(council_round, grace)
    widget_ref = next(
        ref
        for turn in context["turns"]
        for ref in turn["artifact_refs"]
        if ref["media_type"] == "image/svg+xml"
    )
    turn_add(
        council_round=council_round,
        participant=grace,
        text=(
            f"Looking at Ada's risk map (artifact {widget_ref['id']}): flooding "
            "is the one to act on first — a sump pump check and moving the "
            "documents box upstairs cost little. The boiler can wait for its "
            "autumn service."
        ),
        cites=[widget_ref["id"]],
    )
    turn_add(
        council_round=council_round,
        participant=kit,
        text=(
            f"Agreed on flooding. From the same map (artifact {widget_ref['id']}) "
            "I would add renewing the insurance: low likelihood, but the impact "
            "is the highest on the grid."
        ),
        cites=[widget_ref["id"]],
    )
    # Kit had the last word, and sums the round up.
    return round_conclude(
        council_round=council_round,
        outcome=DEMO_OUTCOME,
        actor="participant:Kit",
        participant=kit,
    )
