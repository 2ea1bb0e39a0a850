"""Council rows and their artifacts leave with their conversation, and only then."""

from __future__ import annotations

import pytest

from artifacts.models import Artifact
from artifacts.store import default_store
from council.demo import demo_round_load
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from council.services import round_start, turn_add
from tasks.services import conversation_delete


@pytest.mark.django_db
def test_deleting_the_demo_conversation_removes_widgets_previews_contexts_and_blobs(
    user, django_capture_on_commit_callbacks
):
    council_round = demo_round_load(owner=user)
    assert Artifact.objects.count() == 5  # widget, preview, three contexts

    # Blob files go after commit.
    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=council_round.conversation_id)

    assert CouncilRound.objects.count() == 0
    assert Participant.objects.count() == 0
    assert Turn.objects.count() == 0
    assert TurnArtifact.objects.count() == 0
    assert Artifact.objects.count() == 0
    assert list(default_store().shas()) == []


@pytest.mark.django_db
def test_a_widget_cited_from_another_conversation_survives_its_makers_deletion(
    user, make_conversation, django_capture_on_commit_callbacks
):
    source_round = demo_round_load(owner=user)
    widget = Artifact.objects.get(media_type="image/svg+xml")
    other = round_start(
        conversation=make_conversation(owner=user, title="Follow-up"),
        topic="Follow-up",
        participants=[("Kit", "kimi")],
    )
    turn_add(
        council_round=other,
        participant=other.participants.get(),
        text="Still relevant.",
        cites=[widget.pk],
    )

    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=source_round.conversation_id)

    assert Artifact.objects.filter(pk=widget.pk).exists()
    assert default_store().verify(widget.sha256)
