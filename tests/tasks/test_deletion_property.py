"""Property: random worlds, random deletions through random doors; the artifacts
that survive are exactly those a small reference model of the rule keeps, and
nothing is orphaned, unowned or missing its blob.

Two users share bytes: every artifact of the world is the same bytes for both
owners, so each owner has its own row over one shared blob. Deleting one
owner's conversations never removes a blob the other still names."""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from artifacts.services import artifact_store
from artifacts.store import default_store
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from tasks.models import Conversation, Step, Task, TaskArtifact
from tasks.services import conversation_delete, event_append
from tests.support.leftovers import assert_no_leftovers

# Conversation.delete() refuses (tests/tasks/test_deletion.py): the service and
# a user's delete are the doors.
DOORS = ["service", "user"]
TASK_REFS = ["persisted", "referenced", "output"]
TURN_REFS = ["produced", "cited"]


@dataclass
class World:
    owners: list[int]  # conversation index -> user index
    sources: list[set[int]]  # artifact index -> source indexes
    tasks: list[tuple[int, list[tuple[int, str]]]]  # (conversation, refs)
    turns: list[tuple[int, list[tuple[int, str]]]]
    deletions: list[tuple[int, str]]  # (conversation, door)


@st.composite
def worlds(draw) -> World:
    n_conv = draw(st.integers(1, 4))
    n_art = draw(st.integers(1, 10))
    art = st.integers(0, n_art - 1)
    # Mostly a DAG (sources made earlier), plus a few arbitrary edges: cycles too.
    sources = [
        draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        for i in range(n_art)
    ]
    for derived, source in draw(st.lists(st.tuples(art, art), max_size=2)):
        if derived != source:
            sources[derived].add(source)
    conv = st.integers(0, n_conv - 1)
    tasks = draw(
        st.lists(
            st.tuples(
                conv, st.lists(st.tuples(art, st.sampled_from(TASK_REFS)), max_size=4)
            ),
            max_size=6,
        )
    )
    turns = draw(
        st.lists(
            st.tuples(
                conv, st.lists(st.tuples(art, st.sampled_from(TURN_REFS)), max_size=3)
            ),
            max_size=4,
        )
    )
    owners = draw(st.lists(st.integers(0, 1), min_size=n_conv, max_size=n_conv))
    order = draw(st.permutations(range(n_conv)))
    k = draw(st.integers(1, n_conv))
    deletions = [(c, draw(st.sampled_from(DOORS))) for c in order[:k]]
    return World(owners, sources, tasks, turns, deletions)


def reference_survivors(world: World, deleted: set[int]) -> set[tuple[int, int]]:
    """The rule as a closure within each owner: live refs keep that owner's
    rows, kept rows keep their sources; everything else is gone.
    Returns {(artifact index, owner index)}."""
    kept: set[tuple[int, int]] = set()
    stack = [
        (a, world.owners[c])
        for c, refs in world.tasks + world.turns
        if c not in deleted
        for a, _ in refs
    ]
    while stack:
        a, owner = stack.pop()
        if (a, owner) not in kept:
            kept.add((a, owner))
            stack.extend((s, owner) for s in world.sources[a])
    return kept


def build(world: World) -> tuple[list, list[Conversation], dict]:
    users = [
        get_user_model().objects.create_user(f"p{i}-{uuid.uuid4().hex[:8]}")
        for i in range(2)
    ]
    convs = [
        Conversation.objects.create(owner=users[o], title=f"c{i}")
        for i, o in enumerate(world.owners)
    ]
    exists = reference_survivors(world, deleted=set())
    tag = uuid.uuid4().hex
    ids: dict[tuple[int, int], int] = {}
    for a, owner in sorted(exists):
        # The same bytes for both owners: one blob, one row each.
        ids[(a, owner)] = artifact_store(
            owner=users[owner],
            data=f"artifact {a} {tag}".encode(),
            media_type="text/plain",
            artifact_class=ArtifactClass.RENDER,
            title=f"owner {owner}'s artifact {a}",
        ).pk
    for a, owner in ids:
        for s in world.sources[a]:
            # A kept row's sources are kept, hence exist for the same owner.
            ArtifactSource.objects.get_or_create(
                artifact_id=ids[(a, owner)], source_id=ids[(s, owner)]
            )
    for c, refs in world.tasks:
        task = Task.objects.create(conversation=convs[c], title="t")
        owner = world.owners[c]
        for position, (a, kind) in enumerate(refs):
            if kind == "output":
                step = Step.objects.create(
                    task=task,
                    position=position,
                    title="s",
                    tool="t",
                    status="done",
                    output_id=ids[(a, owner)],
                )
                event_append(
                    task_id=task.pk, step_id=step.pk, kind="tool_result_persisted"
                )
            else:
                TaskArtifact.objects.get_or_create(
                    task=task, artifact_id=ids[(a, owner)], role=kind
                )
    rounds: dict[int, CouncilRound] = {}
    for order, (c, refs) in enumerate(world.turns):
        if c not in rounds:
            rounds[c] = CouncilRound.objects.create(
                conversation=convs[c], number=1, topic="t"
            )
        who = Participant.objects.create(round=rounds[c], name=f"brain{order}")
        turn = Turn.objects.create(round=rounds[c], participant=who, order=order)
        for a, role in refs:
            TurnArtifact.objects.get_or_create(
                turn=turn, artifact_id=ids[(a, world.owners[c])], role=role
            )
    return users, convs, ids


class Rollback(Exception):
    pass


@pytest.mark.django_db
@pytest.mark.slow  # 60 generated histories: ~15 s alone, more on a busy machine
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(world=worlds())
def test_surviving_artifacts_match_the_reference_model_of_the_rule(
    world, django_capture_on_commit_callbacks
):
    blob_dir = tempfile.mkdtemp(prefix="prop-blobs-")
    try:
        with override_settings(BLOB_DIR=blob_dir), transaction.atomic():
            check_world(world, django_capture_on_commit_callbacks)
            raise Rollback
    except Rollback:
        pass


def check_world(world: World, capture) -> None:
    users, convs, ids = build(world)
    assert_no_leftovers()  # the generated world starts clean
    deleted: set[int] = set()
    for c, door in world.deletions:
        before = reference_survivors(world, deleted)
        with capture(execute=True):
            if c in deleted:
                report = conversation_delete(conversation_id=convs[c].pk)
                assert report.total_removed == 0
            elif door == "service":
                report = conversation_delete(conversation_id=convs[c].pk)
            else:
                owner = world.owners[c]
                users[owner].delete()
                deleted |= {i for i, o in enumerate(world.owners) if o == owner}
        if door == "service" and c not in deleted:
            after = reference_survivors(world, deleted | {c})
            assert {r.id for r in report.removed_artifacts} == {
                ids[a] for a in before - after
            }
            assert {r.id for r in report.kept_artifacts} <= {ids[a] for a in after}
        deleted.add(c)
        survivors = reference_survivors(world, deleted)
        expected = {ids[key] for key in survivors}
        assert set(Artifact.objects.values_list("pk", flat=True)) == expected
        # A blob stays exactly while some owner's surviving row names it.
        shas = dict(Artifact.objects.values_list("pk", "sha256"))
        named = {shas[ids[key]] for key in survivors}
        on_disk = set(default_store().shas())
        assert on_disk == named
        assert_no_leftovers()
