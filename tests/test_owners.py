"""The one visibility rule (``pippa_site.owners``) on every owned model.

A user sees their own rows; staff see every row only when the caller opts in
with ``staff=True``; an anonymous user sees nothing. The same rule answers for
a row in hand (``user_sees_row``) and in hand-written SQL (``sees_every_row``).
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import AnonymousUser
from django.http import Http404

from api.models import ApiToken, OAuthGrant
from api.services import token_create
from artifacts.models import Artifact
from artifacts.selectors import artifact_get_for_user, artifact_user_may_see
from council.models import CouncilRound, Turn, TurnArtifact
from council.selectors import round_get_for_user, turn_get_for_user
from pippa_site.owners import sees_every_row, user_sees_row
from tasks.documents import conversation_get_for_user, task_get_for_user
from tasks.models import Conversation, Step, Task, TaskArtifact
from tests.support.leftovers import conversation_with_everything
from tests.support.oauth import grant_for

OWNED_MODELS = [
    Conversation,
    Task,
    Step,
    TaskArtifact,
    Artifact,
    CouncilRound,
    Turn,
    TurnArtifact,
    ApiToken,
    OAuthGrant,
]


@pytest.fixture
def world(make_user):
    """Two users with a row in every owned model each, and a staff user with none."""
    alice, bob = make_user(), make_user()
    staff = make_user(is_staff=True)
    for person in (alice, bob):
        conversation_with_everything(owner=person)
        token_create(user=person, name="runner")
        grant_for(person)
    return alice, bob, staff


def _owner_ids(model, rows) -> set[int]:
    return set(rows.values_list(model.objects.none().owner_field, flat=True))


@pytest.mark.django_db
@pytest.mark.parametrize("model", OWNED_MODELS, ids=lambda m: m.__name__)
def test_for_user_shows_each_user_only_their_own_rows(world, model):
    alice, bob, _ = world
    mine = model.objects.for_user(alice)
    theirs = model.objects.for_user(bob)

    assert mine.exists()
    assert theirs.exists()
    assert _owner_ids(model, mine) == {alice.pk}
    assert _owner_ids(model, theirs) == {bob.pk}
    assert mine.count() + theirs.count() == model.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("model", OWNED_MODELS, ids=lambda m: m.__name__)
def test_for_user_shows_staff_every_row_only_when_the_caller_opts_in(world, model):
    *_, staff = world

    assert not model.objects.for_user(staff).exists()
    assert model.objects.for_user(staff, staff=True).count() == model.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("model", OWNED_MODELS, ids=lambda m: m.__name__)
def test_for_user_shows_an_anonymous_user_nothing_even_with_staff(world, model):
    assert not model.objects.for_user(AnonymousUser(), staff=True).exists()


@pytest.mark.django_db
def test_staff_opt_in_does_not_widen_a_plain_users_view(world):
    alice, bob, _ = world

    rows = Conversation.objects.for_user(alice, staff=True)

    assert set(rows.values_list("owner_id", flat=True)) == {alice.pk}


@pytest.mark.django_db
def test_the_row_rule_and_the_sql_rule_agree_with_for_user(world):
    alice, bob, staff = world

    assert user_sees_row(alice, alice.pk)
    assert not user_sees_row(alice, bob.pk)
    assert not user_sees_row(alice, bob.pk, staff=True)
    assert not user_sees_row(staff, bob.pk)
    assert user_sees_row(staff, bob.pk, staff=True)
    assert not user_sees_row(AnonymousUser(), None, staff=True)
    assert sees_every_row(staff, staff=True)
    assert not sees_every_row(staff, staff=False)
    assert not sees_every_row(alice, staff=True)


@pytest.mark.django_db
def test_every_get_for_user_is_owner_only_unless_staff_is_asked_for(world):
    alice, bob, staff = world
    task = Task.objects.filter(conversation__owner=bob).first()
    council_round = CouncilRound.objects.filter(conversation__owner=bob).first()
    turn = Turn.objects.filter(round=council_round).first()
    artifact = Artifact.objects.filter(owner=bob).first()
    getters = [
        lambda **kw: conversation_get_for_user(
            conversation_id=task.conversation_id, **kw
        ),
        lambda **kw: task_get_for_user(task_id=task.pk, **kw),
        lambda **kw: round_get_for_user(round_id=council_round.pk, **kw),
        lambda **kw: turn_get_for_user(turn_id=turn.pk, **kw),
        lambda **kw: artifact_get_for_user(artifact_id=artifact.pk, **kw),
    ]

    for get in getters:
        assert get(user=bob).pk
        assert get(user=staff, staff=True).pk
        for stranger, staff_view in ((alice, False), (alice, True), (staff, False)):
            with pytest.raises(Http404):
                get(user=stranger, staff=staff_view)
    assert artifact_user_may_see(user=bob, artifact_id=artifact.pk)
    assert not artifact_user_may_see(user=staff, artifact_id=artifact.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("task_id", ["abc", None, -1, 0, 2**70, "1; --", 10**9])
def test_a_task_id_that_names_no_task_is_a_404_with_the_id_in_words(world, task_id):
    _, bob, _ = world
    with pytest.raises(Http404, match=f"task {re.escape(str(task_id))} not found"):
        task_get_for_user(user=bob, task_id=task_id, staff=True)


@pytest.mark.django_db
def test_a_task_comes_with_its_conversation_and_a_stranger_cannot_tell_it_exists(
    world, django_assert_num_queries
):
    alice, bob, _ = world
    task = Task.objects.filter(conversation__owner=bob).first()
    with django_assert_num_queries(1):  # the task with its conversation
        got = task_get_for_user(user=bob, task_id=task.pk)
        assert got.conversation.owner_id == bob.pk
    with pytest.raises(Http404) as theirs:
        task_get_for_user(user=alice, task_id=task.pk)
    with pytest.raises(Http404) as missing:
        task_get_for_user(user=alice, task_id=10**9)
    assert str(theirs.value).replace(str(task.pk), "N") == str(missing.value).replace(
        str(10**9), "N"
    )
