"""Council pages and the branch-context endpoints: login-required, owner-checked
(staff see every round here, ``pippa_site.owners``).

Reading a round or a context is read-only: no lease, no state change.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from artifacts.caching import immutable, not_modified
from council.selectors import (
    context_for,
    next_participant,
    round_get_for_user,
    round_page,
    turn_context_bytes,
    turn_context_sha,
    turn_context_view,
    turn_get_for_user,
)
from council.services import (
    MAX_OUTCOME_CHARS,
    CouncilError,
    brain_label,
    context_bytes,
    round_conclude,
)
from pippa_site.login import login_required
from pippa_site.owners import staff_reads

MSG_CONCLUDED = (
    "Round {number} is concluded. Its outcome is shown first, and the"
    " participants of the next round will read it."
)
MSG_NOT_CONCLUDED = "Nothing was saved: {reason}."


def _json(body: bytes) -> HttpResponse:
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-store"
    return response


@require_GET
@login_required
def round_detail(request: HttpRequest, round_id: int) -> HttpResponse:
    council_round = round_get_for_user(
        user=request.user, round_id=round_id, staff=staff_reads(request)
    )
    participants = list(council_round.participants.all())
    return render(
        request,
        "council/round_detail.html",
        {
            "round": council_round,
            "participants": [(p, brain_label(p.brain)) for p in participants],
            "turns": round_page(council_round=council_round),
            "next": next_participant(council_round=council_round),
            "max_outcome": MAX_OUTCOME_CHARS,
        },
    )


@require_POST
@login_required
def round_conclude_view(request: HttpRequest, round_id: int) -> HttpResponse:
    """Dad writes the round's outcome (or rewords it): the round is concluded."""
    # A write acts on the person's own rounds only.
    council_round = round_get_for_user(user=request.user, round_id=round_id)
    try:
        round_conclude(
            council_round=council_round,
            outcome=request.POST.get("outcome", "")[: MAX_OUTCOME_CHARS * 2],
            actor=f"user:{request.user.get_username()}",
        )
    except CouncilError as exc:
        messages.error(request, MSG_NOT_CONCLUDED.format(reason=exc))
        return redirect(council_round)
    messages.success(request, MSG_CONCLUDED.format(number=council_round.number))
    return redirect(council_round)


@require_GET
@login_required
def round_context(request: HttpRequest, round_id: int) -> HttpResponse:
    """The context the next speaker (or ``?participant=<id>``) would receive now."""
    council_round = round_get_for_user(
        user=request.user, round_id=round_id, staff=staff_reads(request)
    )
    context = context_for(
        council_round=council_round, participant_id=request.GET.get("participant")
    )
    return _json(context_bytes(context))


@require_GET
@login_required
def turn_context(request: HttpRequest, turn_id: int) -> HttpResponse:
    """The stored context this turn's speaker received, byte for byte."""
    turn = turn_get_for_user(
        user=request.user, turn_id=turn_id, staff=staff_reads(request)
    )
    # Stored once and never rewritten: cacheable by its sha like any payload.
    sha = turn_context_sha(turn=turn)
    cached = not_modified(request, sha256=sha)
    if cached is not None:
        return cached
    return immutable(_json(turn_context_bytes(turn=turn, sha256=sha)), sha256=sha)


@require_GET
@login_required
def turn_context_page(request: HttpRequest, turn_id: int) -> HttpResponse:
    """The stored context as readable text with its refs marked.

    The round page folds each turn's context and fetches this fragment (htmx)
    when it is opened; without script the fold links to the whole page.
    """
    turn = turn_get_for_user(
        user=request.user, turn_id=turn_id, staff=staff_reads(request)
    )
    template = "council/turn_context.html" + ("#context" if request.htmx else "")
    return render(request, template, {"context": turn_context_view(turn=turn)})
