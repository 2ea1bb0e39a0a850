"""Council rounds: turns, widgets with previews, and the branch context JSON."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from council.demo import DEMO_TITLE, demo_round_load, risk_map_svg
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from council.selectors import turn_context_bytes
from council.services import (
    ERR_UNKNOWN_CITE,
    ERR_WRONG_ROUND,
    CouncilError,
    context_bytes,
    round_start,
    serialize_branch_context,
    turn_add,
)
from tasks.models import Conversation

REF_KEYS = {
    "id",
    "sha256",
    "artifact_class",
    "class_label",
    "media_type",
    "title",
    "size",
    "source_url",
    "preview_url",
    "source_refs",
}


@pytest.fixture
def council(make_conversation, user):
    conversation = make_conversation(owner=user, title="Council test")
    council_round = round_start(
        conversation=conversation,
        topic="Risks",
        participants=[("Ada", "claude"), ("Grace", "gemini"), ("Kit", "ollama")],
    )
    ada, grace, kit = council_round.participants.order_by("position")
    return council_round, ada, grace, kit


def _svg(filler: int = 0) -> bytes:
    pad = b"<!--" + b"p" * filler + b"-->" if filler else b""
    return (
        b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="80">'
        b'<rect width="120" height="80" fill="#f6b3ad"/>' + pad + b"</svg>"
    )


def _refs(context: dict) -> list[dict]:
    return [ref for turn in context["turns"] for ref in turn["artifact_refs"]]


@pytest.mark.django_db
def test_round_start_numbers_rounds_within_their_conversation(make_conversation):
    conversation = make_conversation()
    first = round_start(conversation=conversation, topic="a", participants=[("A", "")])
    second = round_start(conversation=conversation, topic="b", participants=[("A", "")])
    assert (first.number, second.number) == (1, 2)
    assert Participant.objects.get(round=first).brain == "other"


@pytest.mark.django_db
def test_round_start_refuses_duplicate_participant_names(make_conversation):
    with pytest.raises(CouncilError):
        round_start(
            conversation=make_conversation(),
            topic="x",
            participants=[("Ada", "claude"), ("Ada", "codex")],
        )
    assert CouncilRound.objects.count() == 0


@pytest.mark.django_db
def test_a_turn_widget_is_a_class_4_artifact_with_a_png_preview_naming_it(council):
    council_round, ada, *_ = council
    turn = turn_add(
        council_round=council_round,
        participant=ada,
        text="map",
        widget=_svg(),
        widget_title="Map",
    )
    widget = Artifact.objects.get(media_type="image/svg+xml")
    preview = Artifact.objects.get(media_type="image/png")
    assert widget.artifact_class == ArtifactClass.RENDER
    assert preview.artifact_class == ArtifactClass.RENDER
    assert ArtifactSource.objects.filter(artifact=preview, source=widget).exists()
    assert widget.meta["preview"]["status"] == "ok"
    assert widget.meta["preview"]["artifact_id"] == preview.pk
    produced = set(
        TurnArtifact.objects.filter(turn=turn, role="produced").values_list(
            "artifact_id", flat=True
        )
    )
    assert produced == {widget.pk, preview.pk}
    assert TurnArtifact.objects.filter(turn=turn, role="context").count() == 1


@pytest.mark.django_db
def test_an_html_widget_with_an_svg_inside_gets_a_preview(council):
    council_round, ada, *_ = council
    html = b"<!doctype html><html><body><h2>Chart</h2>" + _svg() + b"</body></html>"
    turn_add(
        council_round=council_round,
        participant=ada,
        text="",
        widget=html,
        widget_media_type="text/html",
    )
    widget = Artifact.objects.get(media_type="text/html")
    assert widget.meta["preview"]["status"] == "ok"


@pytest.mark.django_db
def test_the_next_participant_receives_earlier_turns_text_and_full_artifact_refs(
    council,
):
    council_round, ada, grace, _ = council
    turn_add(
        council_round=council_round, participant=ada, text="See map", widget=_svg()
    )

    context = serialize_branch_context(council_round, grace)

    assert context["schema"] == "pippa.council.context/1"
    assert context["for"] == {"name": "Grace", "brain": "gemini"}
    assert [t["text"] for t in context["turns"]] == ["See map"]
    assert context["turns"][0]["speaker"] == {"name": "Ada", "brain": "claude"}
    (ref,) = _refs(context)
    widget = Artifact.objects.get(media_type="image/svg+xml")
    assert set(ref) >= REF_KEYS
    assert ref["id"] == widget.pk
    assert ref["sha256"] == widget.sha256
    assert ref["artifact_class"] == 4
    assert ref["media_type"] == "image/svg+xml"
    assert ref["size"] == widget.size
    preview = Artifact.objects.get(media_type="image/png")
    # The JSON API's addresses: the bearer token that read the context reads them.
    assert ref["source_url"] == f"/api/v1/artifacts/{widget.pk}/content"
    assert ref["preview_url"] == f"/api/v1/artifacts/{preview.pk}/content"
    assert ref["source_refs"] == []
    assert ref["role"] == "produced"


@pytest.mark.django_db
def test_a_widgets_own_sources_appear_in_its_source_refs(council, make_artifact):
    council_round, ada, grace, _ = council
    data = make_artifact(
        owner=council_round.conversation.owner,
        title="risk scores",
        media_type="text/csv",
    )
    turn_add(
        council_round=council_round,
        participant=ada,
        text="",
        widget=_svg(),
        widget_source_ids=[data.pk],
    )
    (ref,) = _refs(serialize_branch_context(council_round, grace))
    assert ref["source_refs"] == [{"id": data.pk, "sha256": data.sha256}]


@pytest.mark.django_db
def test_a_5_mb_widget_adds_only_its_ref_to_the_context(council, make_conversation):
    council_round, ada, grace, _ = council
    turn_add(council_round=council_round, participant=ada, text="w", widget=_svg())
    small = context_bytes(serialize_branch_context(council_round, grace))

    other = round_start(
        conversation=make_conversation(owner=council_round.conversation.owner),
        topic="Risks",
        participants=[("Ada", "claude"), ("Grace", "gemini")],
    )
    big_widget = _svg(filler=5 * 1024 * 1024)
    turn_add(
        council_round=other,
        participant=other.participants.get(name="Ada"),
        text="w",
        widget=big_widget,
    )
    big = context_bytes(
        serialize_branch_context(other, other.participants.get(name="Grace"))
    )

    assert len(big_widget) > 5_000_000
    assert len(big) < 4_000
    # Same shape; the difference is the size digits and the preview's status
    # (the 5 MB widget is above the render cap), never the payload.
    assert abs(len(big) - len(small)) < 200
    assert b"pppp" not in big


@pytest.mark.django_db
def test_the_context_is_the_same_document_for_every_brain(council):
    council_round, ada, grace, kit = council
    turn_add(council_round=council_round, participant=ada, text="x", widget=_svg())
    for_gemini = serialize_branch_context(council_round, grace)
    for_ollama = serialize_branch_context(council_round, kit)
    assert for_gemini.pop("for") != for_ollama.pop("for")
    assert for_gemini == for_ollama


@pytest.mark.django_db
def test_a_turn_keeps_the_context_its_speaker_received_after_later_turns(council):
    council_round, ada, grace, kit = council
    turn_add(council_round=council_round, participant=ada, text="one", widget=_svg())
    grace_turn = turn_add(council_round=council_round, participant=grace, text="two")
    stored_before = turn_context_bytes(turn=grace_turn)

    turn_add(council_round=council_round, participant=kit, text="three")

    stored = json.loads(turn_context_bytes(turn=grace_turn))
    assert turn_context_bytes(turn=grace_turn) == stored_before
    assert [t["text"] for t in stored["turns"]] == ["one"]
    assert stored == serialize_branch_context(
        council_round, grace, before_order=grace_turn.order
    )


@pytest.mark.django_db
def test_a_citing_turn_records_the_cited_widget_and_the_next_context_shows_it(
    council,
):
    council_round, ada, grace, kit = council
    turn_add(council_round=council_round, participant=ada, text="map", widget=_svg())
    widget_id = _refs(serialize_branch_context(council_round, grace))[0]["id"]

    turn = turn_add(
        council_round=council_round, participant=grace, text="ok", cites=[widget_id]
    )

    assert TurnArtifact.objects.filter(
        turn=turn, artifact_id=widget_id, role="cited"
    ).exists()
    second = serialize_branch_context(council_round, kit)["turns"][1]
    assert [(r["id"], r["role"]) for r in second["artifact_refs"]] == [
        (widget_id, "cited")
    ]


@pytest.mark.django_db
def test_citing_another_users_artifact_is_refused(council, make_artifact, make_task):
    council_round, ada, *_ = council
    stranger_task = make_task()
    theirs = make_artifact()
    stranger_task.artifact_links.create(artifact=theirs)

    with pytest.raises(CouncilError, match=ERR_UNKNOWN_CITE):
        turn_add(
            council_round=council_round, participant=ada, text="x", cites=[theirs.pk]
        )
    assert Turn.objects.count() == 0


@pytest.mark.django_db
def test_a_participant_of_another_round_cannot_speak_here(council, make_conversation):
    council_round, *_ = council
    other = round_start(
        conversation=make_conversation(), topic="y", participants=[("Zed", "grok")]
    )
    with pytest.raises(CouncilError, match=ERR_WRONG_ROUND):
        turn_add(
            council_round=council_round,
            participant=other.participants.get(),
            text="hi",
        )


@pytest.mark.django_db
def test_reading_a_context_writes_nothing(council):
    council_round, ada, grace, _ = council
    turn_add(council_round=council_round, participant=ada, text="x", widget=_svg())
    with CaptureQueriesContext(connection) as queries:
        serialize_branch_context(council_round, grace)
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    assert statements
    assert set(statements) == {"SELECT"}


@pytest.mark.django_db
def test_context_queries_do_not_grow_with_the_number_of_turns(
    council, django_assert_max_num_queries
):
    council_round, ada, grace, kit = council
    for i in range(6):
        speaker = (ada, grace, kit)[i % 3]
        turn_add(
            council_round=council_round,
            participant=speaker,
            text=str(i),
            widget=_svg(filler=i + 1),
        )
    with django_assert_max_num_queries(6):
        context = serialize_branch_context(council_round, ada)
    assert len(context["turns"]) == 6


@pytest.mark.django_db
def test_the_demo_round_is_built_once_and_the_second_speaker_cites_the_risk_map(
    user,
):
    first = demo_round_load(owner=user)
    again = demo_round_load(owner=user)

    assert first.pk == again.pk
    assert Conversation.objects.filter(owner=user, title=DEMO_TITLE).count() == 1
    assert Turn.objects.filter(round=first).count() == 3
    ada_turn, grace_turn, _ = Turn.objects.filter(round=first).order_by("order")
    widget = ada_turn.artifact_links.get(
        role="produced", artifact__media_type="image/svg+xml"
    ).artifact
    assert widget.meta["preview"]["status"] == "ok"
    assert grace_turn.artifact_links.filter(role="cited", artifact=widget).exists()
    assert f"artifact {widget.pk}" in grace_turn.text
    received = json.loads(turn_context_bytes(turn=grace_turn))
    assert _refs(received)[0]["id"] == widget.pk


def test_the_risk_map_widget_is_a_plain_svg_without_script():
    svg = risk_map_svg()
    assert svg.startswith(b'<svg xmlns="http://www.w3.org/2000/svg"')
    assert b"<script" not in svg
