"""Brain turns and the tokens they used: recorded per turn, summed per task.

A runner records each answer its brain gave as one ``brain_turn`` event whose
data is small metadata: the brain, the model, how many tool calls the turn
asked for (and how many of them could not be carried out as sent), and the
vendor's token counts read into one shape (``input_tokens``,
``output_tokens``, ``total_tokens``). Never the text of the turn.

In the same transaction the task's counters (``Task.brain_turns``,
``brain_turns_counted``, ``input_tokens``, ``output_tokens``,
``total_tokens``) grow by the turn's figures: they are the sums of its
``brain_turn`` events, so that no page reads events to show them (a
conversation page reads no task state). Every door shows the same figures:
the task and conversation pages, the JSON API's documents, MCP's ``get_task``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Coalesce

from pippa_site.errors import Invalid
from tasks.models import Event, Task
from tasks.services import event_append

TOKEN_KEYS = ("input_tokens", "output_tokens", "total_tokens")
# A turn's counts are far below this; anything above is a runner's mistake.
MAX_TOKENS = 10**9
MAX_NAME = 100
# A turn's tool calls, asked and malformed: a brain asks for a few.
MAX_CALLS = 1000

ERR_BAD_COUNT = "{key} must be a whole number from 0 to {limit:,}"


class UsageInvalid(Invalid):
    pass


@dataclass(frozen=True)
class TokenTotals:
    """Tokens summed over brain turns; ``counted_turns`` is the turns that had counts."""

    turns: int = 0
    counted_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def as_data(self) -> dict[str, int]:
        return asdict(self)


@transaction.atomic
def brain_turn_record(
    *,
    task,
    brain: str,
    model: str = "",
    tool_calls: int = 0,
    bad_calls: int = 0,
    tokens: dict[str, Any] | None = None,
) -> Event:
    """Append one ``brain_turn`` event for an answer a brain gave on ``task``.

    ``tokens`` is ``{"input_tokens", "output_tokens", "total_tokens"}`` (a
    missing total is the sum of the parts), or None when the vendor sent no
    counts: the turn is then counted, its tokens are not.
    """
    data: dict[str, Any] = {
        "brain": str(brain)[:MAX_NAME],
        "model": str(model)[:MAX_NAME],
        "tool_calls": _count("tool_calls", tool_calls, limit=MAX_CALLS),
        "bad_calls": _count("bad_calls", bad_calls, limit=MAX_CALLS),
    }
    if tokens is not None:
        counts = {key: _count(key, tokens.get(key, 0)) for key in TOKEN_KEYS[:2]}
        total = tokens.get("total_tokens")
        counts["total_tokens"] = (
            _count("total_tokens", total)
            if total
            else counts["input_tokens"] + counts["output_tokens"]
        )
        data.update(counts)
    event = event_append(task_id=task.pk, kind=Event.Kind.BRAIN_TURN, data=data)
    Task.objects.filter(pk=task.pk).update(
        brain_turns=F("brain_turns") + 1,
        brain_turns_counted=F("brain_turns_counted") + int(tokens is not None),
        **{key: F(key) + data.get(key, 0) for key in TOKEN_KEYS},
    )
    return event


def _count(key: str, value: Any, *, limit: int = MAX_TOKENS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageInvalid(ERR_BAD_COUNT.format(key=key, limit=limit))
    if value > limit:
        raise UsageInvalid(ERR_BAD_COUNT.format(key=key, limit=limit))
    return value


COUNTERS = {
    "turns": "brain_turns",
    "counted_turns": "brain_turns_counted",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "total_tokens": "total_tokens",
}


def task_token_usage(*, task, fresh: bool = True) -> TokenTotals:
    """Return the brain turns of ``task`` and the tokens they used.

    ``fresh`` reads the counters from the database (one query by key);
    otherwise from ``task`` as it was loaded.
    """
    if fresh:
        row = Task.objects.filter(pk=task.pk).values(*COUNTERS.values()).first()
        row = row or {}
    else:
        row = {column: getattr(task, column) for column in COUNTERS.values()}
    return TokenTotals(**{key: int(row.get(col) or 0) for key, col in COUNTERS.items()})


def conversation_token_usage(*, conversation) -> TokenTotals:
    """Return the brain turns of every task in ``conversation`` and their tokens."""
    row = Task.objects.filter(conversation_id=conversation.pk).aggregate(
        **{key: Coalesce(Sum(col), 0) for key, col in COUNTERS.items()}
    )
    return TokenTotals(**{key: int(value) for key, value in row.items()})
