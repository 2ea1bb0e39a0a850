"""What one user may hold at once: step runs in flight (the API and MCP share the
count), and active tokens (so a per-token bound cannot be sidestepped)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from api.models import ApiToken
from api.services import ERR_TOO_MANY_TOKENS, TokenError, token_create, token_revoke
from pippa_site.slots import STEP_RUNS
from tasks.models import Step
from tests.api.conftest import new_task, run
from tests.support.executing import invocations

pytestmark = pytest.mark.django_db


@pytest.fixture
def held():
    """Take step-run slots as a call in flight would; give them back after."""
    taken = []

    def take(user) -> None:
        taken.append(STEP_RUNS.take(user.pk))

    yield take
    for ticket in taken:
        STEP_RUNS.give_back(ticket)


def test_a_step_run_past_the_users_cap_is_answered_429_and_runs_nothing(
    api_client, make_api_client, held, settings, tool_log
):
    settings.PIPPA_STEP_RUNS_PER_USER = 1
    task = new_task(api_client)
    held(api_client.user)  # one of this user's runs is in flight

    refused = run(api_client, task["id"])
    other = make_api_client()
    others = run(other, new_task(other)["id"])

    assert refused.status_code == 429
    assert refused["Retry-After"] == "5"
    assert refused.json()["code"] == "too_many"
    assert "you already have 1 step runs in flight" in refused.json()["detail"]
    assert (
        not Step.objects.filter(task_id=task["id"]).exclude(status="pending").exists()
    )
    steps = set(Step.objects.filter(task_id=task["id"]).values_list("pk", flat=True))
    assert not steps & set(invocations(tool_log))
    # Another user's run is not held up by it.
    assert others.status_code == 200, others.content


def test_a_step_run_is_counted_only_while_it_runs(api_client, settings, tool_log):
    settings.PIPPA_STEP_RUNS_PER_USER = 1
    task = new_task(api_client)

    first = run(api_client, task["id"])
    second = run(api_client, task["id"])

    assert (first.status_code, second.status_code) == (200, 200)
    assert STEP_RUNS.held[api_client.user.pk] == 0


def test_past_the_servers_bound_a_step_run_is_answered_503(
    api_client, make_user, held, settings, tool_log
):
    settings.PIPPA_STEP_RUNS = 2
    task = new_task(api_client)
    held(make_user())
    held(make_user())

    refused = run(api_client, task["id"])

    assert refused.status_code == 503
    assert int(refused["Retry-After"]) > 0
    assert refused.json()["code"] == "busy"


def test_a_user_holds_at_most_the_configured_number_of_active_tokens(
    make_user, settings
):
    settings.PIPPA_TOKENS_PER_USER = 3
    user, other = make_user(), make_user()
    made = [token_create(user=user, name=f"t{n}") for n in range(3)]

    with pytest.raises(TokenError) as refused:
        token_create(user=user, name="one too many")
    token_create(user=other, name="another user's")
    token_revoke(token=made[0].token)
    again = token_create(user=user, name="after a revoke")

    assert str(refused.value) == ERR_TOO_MANY_TOKENS.format(limit=3)
    assert ApiToken.objects.filter(user=user, revoked_at__isnull=True).count() == 3
    assert again.token.name == "after a revoke"


def test_the_tokens_page_says_why_a_token_past_the_limit_is_refused(
    client, user, settings
):
    settings.PIPPA_TOKENS_PER_USER = 1
    token_create(user=user, name="only one")
    client.force_login(user)

    response = client.post(reverse("tokens:new"), {"name": "second"})

    assert response.status_code == 400
    assert ERR_TOO_MANY_TOKENS.format(limit=1) in response.content.decode()
    assert ApiToken.objects.filter(user=user).count() == 1
