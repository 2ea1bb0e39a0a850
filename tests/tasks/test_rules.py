"""The resume rules' one table: every rule has words, and the worker's action
and a person's choices come from the same row.

The worker's side is tests/tasks/test_executor.py's; the words a person sees
for each rule are here, on the task page, over MCP and in the API's resume
document.
"""

from __future__ import annotations

import itertools

import pytest

from api.services import token_create
from artifacts.models import ArtifactClass
from artifacts.quota import REASON_QUOTA
from artifacts.services import artifact_store
from pippa_mcp import server
from pippa_mcp.server import acting_as
from tasks.actions import ACTIONS, step_resolve_options
from tasks.executor import step
from tasks.models import Conversation, Event, Step
from tasks.plan import task_create
from tasks.rules import ADOPT, CALL_AGAIN, REVIEW, RULES, Facts, uncertain_rule
from tasks.words import CHOICES

ACTIONS_OF_A_RULE = {ADOPT, CALL_AGAIN, REVIEW, "run", "wait", "none", "blocked"}
FACT_NAMES = {"intact", "remakeable"}


@pytest.mark.parametrize("key", sorted(RULES))
def test_every_resume_rule_has_dads_words_an_action_and_known_choices(key):
    rule = RULES[key]
    assert rule.key == key
    assert rule.says.strip()
    assert rule.words[0].isupper(), rule.words
    assert rule.words.endswith("."), rule.words
    assert rule.action in ACTIONS_OF_A_RULE
    assert set(rule.choices) <= set(CHOICES)
    assert set(rule.only_if) <= set(rule.choices)
    assert set(rule.only_if.values()) <= FACT_NAMES


def test_every_decision_a_person_records_is_a_rule_with_words():
    for action in ACTIONS:
        assert RULES[f"operator_{action}"].words


def _all_facts():
    unsaved = ("", "disk full", f"{REASON_QUOTA}: storing 1 kB more")
    for side_effects, why, cls, saved, intact, sources in itertools.product(
        (False, True), unsaved, list(ArtifactClass), *([(False, True)] * 3)
    ):
        if intact and not saved:
            continue
        yield Facts(
            side_effects=side_effects,
            artifact_class=cls,
            unsaved=why,
            saved=saved,
            verify=lambda intact=intact: intact,
            sources=lambda sources=sources: sources,
        )


def test_each_open_envelope_gets_a_rule_whose_action_a_person_may_also_choose():
    """Whatever the facts, the worker's action is one of a person's choices
    (adopt ↔ "adopt", call again ↔ "rerun"), "adopt" is offered only for an
    intact saved output, and a step that waits always offers a way to stop."""
    seen = set()
    for facts in _all_facts():
        rule = uncertain_rule(facts)
        seen.add(rule.key)
        offered = rule.offered(facts)
        assert rule.words
        assert {"fail", "skip"} <= set(offered), rule.key
        if "adopt" in offered:
            assert facts.intact, rule.key
        if rule.action == ADOPT:
            assert "adopt" in offered, rule.key
        if rule.action == CALL_AGAIN:
            assert "rerun" in offered, rule.key
        if facts.side_effects:
            assert rule.action == REVIEW, rule.key
    envelope_rules = {
        k for k, r in RULES.items() if r.action in (ADOPT, CALL_AGAIN, REVIEW)
    }
    assert seen == envelope_rules


# -- the case that had no words: an outside call whose output could not be saved --


@pytest.fixture
def unsaved_effect(user, settings, tool_log):
    """An outside-effects step that ran, but whose output went over the quota."""
    settings.PIPPA_QUOTA_BYTES = 2000
    artifact_store(
        owner=user, data=b"x" * 1990, media_type="text/plain", artifact_class=3
    )
    conversation = Conversation.objects.create(owner=user, title="Mail")
    task = task_create(
        conversation=conversation,
        title="Send the report",
        steps=[{"title": "Email the report", "tool": "test.effect", "args": {}}],
    )
    step(task_id=task.pk, worker_id="w")
    the_step = Step.objects.get(task=task)
    assert the_step.status == Step.Status.NEEDS_REVIEW
    rule = Event.objects.get(step=the_step, kind="step_needs_review").data["rule"]
    assert rule == "side_effects_unsaved_review"
    return task


WORDS = RULES["side_effects_unsaved_review"].words


@pytest.mark.django_db
def test_an_unsaved_outside_call_says_what_pippa_would_do_on_the_task_page(
    client, user, unsaved_effect
):
    client.force_login(user)
    body = client.get(unsaved_effect.get_absolute_url()).content.decode()
    assert f"<strong>What Pippa would do by itself:</strong> {WORDS}" in body
    assert step_resolve_options(unsaved_effect.steps.get()) == ["rerun", "fail", "skip"]


@pytest.mark.django_db
def test_an_unsaved_outside_call_says_what_pippa_would_do_over_mcp_and_the_api(
    client, user, unsaved_effect
):
    with acting_as(user):
        (waiting,) = server.decision_choices(task_id=unsaved_effect.pk)["decisions"]
    assert waiting["rule"] == "side_effects_unsaved_review"
    assert waiting["plain_words"] == WORDS
    assert [c["action"] for c in waiting["choices"]] == [
        "rerun",
        "retry",
        "fail",
        "skip",
    ]

    raw = token_create(user=user, name="runner").raw
    url = f"/api/v1/tasks/{unsaved_effect.pk}/resume-context"
    document = client.get(url, headers={"Authorization": f"Bearer {raw}"}).json()
    (waiting,) = document["next"]
    assert waiting["resume"]["rule"] == "side_effects_unsaved_review"
    assert waiting["resume"]["words"].startswith(
        f"needs you: the tool ran; its output could not be saved: {REASON_QUOTA}"
    )
