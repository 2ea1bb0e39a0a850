"""The migration that gives every artifact row an owner, run on a database the
previous schema built, with two owners sharing bytes."""

from __future__ import annotations

import pytest

from tests.support.migrating import migrate_back, migrate_forward

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("artifacts", "0002_pending_unlink")
SHA = {
    name: f"{i:064x}"
    for i, name in enumerate(["csv", "widget", "lookalike", "png", "lost"], 1)
}


def _old_world(apps) -> dict:
    """What the shared-row schema allowed: Bob stored Alice's CSV first (as
    class-3 HTML with a phishing title), and one preview row served both
    users' look-alike widgets, naming both as sources."""
    User = apps.get_model("auth", "User")
    Conversation = apps.get_model("tasks", "Conversation")
    Task = apps.get_model("tasks", "Task")
    Step = apps.get_model("tasks", "Step")
    Event = apps.get_model("tasks", "Event")
    TaskArtifact = apps.get_model("tasks", "TaskArtifact")
    Artifact = apps.get_model("artifacts", "Artifact")
    ArtifactSource = apps.get_model("artifacts", "ArtifactSource")
    CouncilRound = apps.get_model("council", "CouncilRound")
    Participant = apps.get_model("council", "Participant")
    Turn = apps.get_model("council", "Turn")
    TurnArtifact = apps.get_model("council", "TurnArtifact")

    alice = User.objects.create(username="alice")
    bob = User.objects.create(username="bob")

    def row(name, **fields):
        fields.setdefault("size", 10)
        fields.setdefault("integrity", "ok")
        return Artifact.objects.create(sha256=SHA[name], **fields)

    csv = row(
        "csv",
        media_type="text/html",
        artifact_class=3,
        title="URGENT: re-enter your bank login",
        meta={"uploaded_for_task": 0},
    )
    widget = row(
        "widget", media_type="image/svg+xml", artifact_class=4, title="A's chart"
    )
    lookalike = row(
        "lookalike", media_type="image/svg+xml", artifact_class=4, title="B's chart"
    )
    png = row(
        "png",
        media_type="image/png",
        artifact_class=4,
        title="Preview of A's chart",
        meta={"preview_of": widget.pk},
    )
    lost = row("lost", media_type="text/plain", artifact_class=3, title="nobody's")
    Artifact.objects.filter(pk=widget.pk).update(
        meta={"preview": {"status": "ok", "artifact_id": png.pk, "sha256": SHA["png"]}}
    )
    Artifact.objects.filter(pk=lookalike.pk).update(
        meta={"preview": {"status": "ok", "artifact_id": png.pk, "sha256": SHA["png"]}}
    )
    ArtifactSource.objects.create(artifact=widget, source=csv, position=0)
    ArtifactSource.objects.create(artifact=png, source=widget, position=0)
    ArtifactSource.objects.create(artifact=png, source=lookalike, position=1)

    # Bob's upload of the CSV bytes, linked to Bob's task.
    b_conv = Conversation.objects.create(owner=bob, title="b")
    b_task = Task.objects.create(conversation=b_conv, title="b")
    TaskArtifact.objects.create(task=b_task, artifact=csv, role="persisted")
    # Alice's fetch step produced the same bytes; its event says what it was.
    a_conv = Conversation.objects.create(owner=alice, title="a")
    a_task = Task.objects.create(conversation=a_conv, title="a")
    a_step = Step.objects.create(
        task=a_task,
        position=1,
        title="fetch",
        tool="demo.closes",
        artifact_class=2,
        status="done",
        output=csv,
    )
    Event.objects.create(
        task=a_task,
        step=a_step,
        seq=1,
        kind="payload_persisted",
        data={
            "sha": SHA["csv"],
            "size": 10,
            "media_type": "text/csv",
            "title": "PIPA closes",
        },
    )
    TaskArtifact.objects.create(task=a_task, step=a_step, artifact=csv)
    # Each user's council turn produced a widget and (the shared) preview.
    for owner, conv, made in ((alice, a_conv, widget), (bob, b_conv, lookalike)):
        council_round = CouncilRound.objects.create(
            conversation=conv, number=1, topic="t"
        )
        speaker = Participant.objects.create(round=council_round, name=owner.username)
        turn = Turn.objects.create(round=council_round, participant=speaker, order=1)
        TurnArtifact.objects.create(turn=turn, artifact=made, role="produced")
        TurnArtifact.objects.create(turn=turn, artifact=png, role="produced")
    return {
        "alice": alice.pk,
        "bob": bob.pk,
        "csv": csv.pk,
        "widget": widget.pk,
        "lookalike": lookalike.pk,
        "png": png.pk,
        "lost": lost.pk,
        "a_step": a_step.pk,
        "b_task": b_task.pk,
    }


def test_the_migration_splits_shared_rows_per_owner_with_links_and_lineage():
    from artifacts.models import Artifact
    from council.models import TurnArtifact
    from tasks.models import Step, TaskArtifact
    from tests.support.leftovers import find_leftovers

    ids = _old_world(migrate_back(BEFORE))
    migrate_forward()

    def rows(owner):
        return {a.sha256: a for a in Artifact.objects.filter(owner_id=ids[owner])}

    alice, bob = rows("alice"), rows("bob")
    # Each owner has a row over each blob they reach; nobody's row is gone.
    assert set(alice) == {SHA["csv"], SHA["widget"], SHA["png"]}
    assert set(bob) == {SHA["csv"], SHA["lookalike"], SHA["png"]}
    assert not Artifact.objects.filter(pk=ids["lost"]).exists()
    # Alice's step output is Alice's row, described by Alice's own step.
    a_csv = alice[SHA["csv"]]
    assert Step.objects.get(pk=ids["a_step"]).output_id == a_csv.pk
    assert (a_csv.title, a_csv.media_type, a_csv.artifact_class) == (
        "PIPA closes",
        "text/csv",
        2,
    )
    # Bob's upload stays Bob's, as Bob described it.
    b_csv = bob[SHA["csv"]]
    assert TaskArtifact.objects.get(task_id=ids["b_task"]).artifact_id == b_csv.pk
    assert (b_csv.title, b_csv.artifact_class) == (
        "URGENT: re-enter your bank login",
        3,
    )
    # The shared preview is now one per owner, each deriving from its owner's
    # widget only, and each widget's preview record names its owner's PNG.
    a_png, b_png = alice[SHA["png"]], bob[SHA["png"]]
    assert list(a_png.sources.all()) == [alice[SHA["widget"]]]
    assert list(b_png.sources.all()) == [bob[SHA["lookalike"]]]
    assert list(alice[SHA["widget"]].sources.all()) == [a_csv]
    assert alice[SHA["widget"]].meta["preview"]["artifact_id"] == a_png.pk
    assert bob[SHA["lookalike"]].meta["preview"]["artifact_id"] == b_png.pk
    assert a_png.meta["preview_of"] == alice[SHA["widget"]].pk
    assert "preview_of" not in b_png.meta  # Bob has no row of Alice's widget
    assert TurnArtifact.objects.filter(artifact=b_png).count() == 1
    assert TurnArtifact.objects.filter(artifact=a_png).count() == 1
    # Nothing joins two owners any more (the leftovers checker says so).
    cross = [p for p in find_leftovers() if "owner" in p]
    assert cross == []
