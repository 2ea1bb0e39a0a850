"""The round page grows linearly with its turns: contexts are folded and fetched when opened."""

from __future__ import annotations

import pytest
from django.urls import reverse

from council.models import Turn
from council.services import round_start, turn_add
from tests.tasks.dashboard_data import add_steps

pytestmark = pytest.mark.django_db

WORDS = "The numbers hold; I checked the June prices against the market report. " * 3


def _round(conversation, turns: int, cited: list[int]):
    council_round = round_start(
        conversation=conversation,
        topic=f"Budget with {turns} turns",
        participants=[("Ada", "claude"), ("Grace", "gemini"), ("Kit", "kimi")],
    )
    speakers = list(council_round.participants.order_by("position"))
    for i in range(turns):
        turn_add(
            council_round=council_round,
            participant=speakers[i % 3],
            text=f"Turn {i + 1}. {WORDS}",
            cites=cited,
        )
    return council_round


def _receipts(conversation, make_task, count: int) -> list[int]:
    """Artifacts the turns can cite: outputs of a task in the same conversation."""
    task = make_task(conversation=conversation, title="Collect receipts")
    return [step.output_id for step in add_steps(task, count, done=count)]


def test_round_page_size_grows_linearly_from_10_to_50_turns(
    client, user, make_conversation, make_task
):
    client.force_login(user)
    conversation = make_conversation(owner=user, title="Household budget")
    cited = _receipts(conversation, make_task, 3)
    size = {}
    last_context = {}
    for turns in (0, 10, 50):
        council_round = _round(conversation, turns, cited)
        response = client.get(council_round.get_absolute_url())
        assert response.status_code == 200
        assert response.content.count(b'class="turn"') == turns
        size[turns] = len(response.content)
        last = Turn.objects.filter(round=council_round).order_by("-order").first()
        if last is not None:
            url = reverse("council:turn_context", args=[last.pk])
            last_context[turns] = len(client.get(url).content)

    per_turn_10 = (size[10] - size[0]) / 10
    per_turn_50 = (size[50] - size[0]) / 50
    # Linear: each turn adds about the same bytes however many came before.
    assert per_turn_50 <= per_turn_10 * 1.1, (size, per_turn_10, per_turn_50)
    # ...although each turn's context does grow with the turns before it, so
    # inlining the contexts would have made the page grow with the square.
    assert last_context[50] > 4 * last_context[10]


def test_opening_one_fold_fetches_only_that_turns_context(
    client, user, make_conversation, make_task
):
    client.force_login(user)
    conversation = make_conversation(owner=user, title="Household budget")
    cited = _receipts(conversation, make_task, 1)
    council_round = _round(conversation, 12, cited)
    turn = Turn.objects.get(round=council_round, order=12)
    url = reverse("council:turn_context_page", args=[turn.pk])
    fragment = client.get(url, headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.content.count(b"Turn 11.") == 1  # the earlier turns' text
    assert b"Turn 12." not in fragment.content  # not its own, nor later ones
