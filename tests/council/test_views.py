"""The round viewer and the context endpoints: authenticated, owner-checked, read-only."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from api.services import token_create
from artifacts.models import Artifact
from council.models import Turn
from council.services import round_start, turn_add

SCRIPTED_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="160" height="90" '
    b"onload=\"document.title='pwned'\">"
    b"<script>alert('pwned')</script>"
    b'<rect width="160" height="90" fill="#ffe3a3"/></svg>'
)
BROKEN_SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><rect></svg>'


@pytest.fixture
def council_round(make_conversation, user):
    council_round = round_start(
        conversation=make_conversation(owner=user, title="Household"),
        topic="Risks",
        participants=[("Ada", "claude"), ("Grace", "gemini"), ("Kit", "kimi")],
    )
    ada, grace, _ = council_round.participants.order_by("position")
    turn_add(
        council_round=council_round,
        participant=ada,
        text="Here is the map.",
        widget=SCRIPTED_SVG,
        widget_title="Risk map",
    )
    widget = Artifact.objects.get(media_type="image/svg+xml")
    turn_add(
        council_round=council_round,
        participant=grace,
        text="I read it.",
        cites=[widget.pk],
    )
    return council_round


def _widget() -> Artifact:
    return Artifact.objects.get(media_type="image/svg+xml")


@pytest.mark.django_db
def test_round_page_shows_turns_in_order_with_names_brains_text_and_previews(
    dad_client, council_round
):
    widget = _widget()
    response = dad_client.get(council_round.get_absolute_url())
    page = response.content.decode()
    assert response.status_code == 200
    turns = page[page.index('<ol class="turns">') :]  # the outcome quotes the last
    assert turns.index("Here is the map.") < turns.index("I read it.")
    assert "Ada" in page
    assert "Claude" in page
    assert "Gemini" in page
    assert f'src="/artifacts/{widget.pk}/preview.png"' in page
    assert f'href="/artifacts/{widget.pk}/source/text"' in page
    assert "“<bdi>Risk map</bdi>”</a>" in page  # Grace's citation, by its title


@pytest.mark.django_db
def test_round_page_never_inlines_the_widget_markup(dad_client, council_round):
    page = dad_client.get(council_round.get_absolute_url()).content.decode()
    assert "<script>alert" not in page
    assert "onload=" not in page
    assert "<svg" not in page


@pytest.mark.django_db
def test_round_page_folds_each_turns_context_and_links_to_it(dad_client, council_round):
    grace_turn = Turn.objects.get(round=council_round, order=2)
    page = dad_client.get(council_round.get_absolute_url()).content.decode()
    grace_section = page[page.index('id="turn-2"') :]
    context_url = reverse("council:turn_context_page", args=[grace_turn.pk])
    assert "What <bdi>Grace</bdi> was shown first" in grace_section
    assert f'hx-get="{context_url}"' in grace_section
    assert f'href="{context_url}"' in grace_section  # works without script too
    assert '<mark class="ref">' not in page  # no context text until opened
    ada_section = page[page.index('id="turn-1"') : page.index('id="turn-2"')]
    assert "(the question only)" in ada_section
    assert "(the question and the 1 turn before)" in grace_section


@pytest.mark.django_db
def test_an_opened_context_shows_its_refs_highlighted_each_artifact_named_once(
    dad_client, council_round
):
    widget = _widget()
    kit = council_round.participants.get(name="Kit")
    turn = turn_add(council_round=council_round, participant=kit, text="late")
    url = reverse("council:turn_context_page", args=[turn.pk])
    fragment = dad_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<mark class="ref">[' in fragment
    assert f"&quot;id&quot;: {widget.pk}" in fragment
    # Ada made it and Grace cited it: one artifact, named twice, said once.
    assert (
        f'Highlighted: the refs to\n  <a href="/artifacts/{widget.pk}/">'
        f"artifact {widget.pk}</a> (named 2 times)." in fragment
    )
    assert "<header" not in fragment  # a fragment, no page chrome
    page = dad_client.get(url).content.decode()
    assert 'aria-current="page"><bdi>What they were shown</bdi><' in page
    # In words first: whose turns, with the titles of what they made.
    assert "Ada</bdi>’s words, with “<bdi>" in fragment
    assert f'href="{council_round.get_absolute_url()}#turn-3"' in page


@pytest.mark.django_db
def test_the_first_turns_context_says_there_is_nothing_to_highlight(
    dad_client, council_round
):
    ada_turn = Turn.objects.get(round=council_round, order=1)
    url = reverse("council:turn_context_page", args=[ada_turn.pk])
    fragment = dad_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "no refs to highlight" in fragment
    assert "<mark" not in fragment


@pytest.mark.django_db
def test_round_page_says_when_a_preview_failed_and_why(dad_client, council_round):
    kit = council_round.participants.get(name="Kit")
    turn_add(council_round=council_round, participant=kit, text="", widget=BROKEN_SVG)
    page = dad_client.get(council_round.get_absolute_url()).content.decode()
    assert "the preview failed — malformed XML" in page
    assert "The widget itself is stored" in page


@pytest.mark.django_db
def test_another_users_round_and_contexts_are_404(client, make_user, council_round):
    client.force_login(make_user())
    turn = Turn.objects.filter(round=council_round).first()
    for url in (
        council_round.get_absolute_url(),
        reverse("council:context", args=[council_round.pk]),
        reverse("council:turn_context", args=[turn.pk]),
        reverse("council:turn_context_page", args=[turn.pk]),
    ):
        assert client.get(url).status_code == 404


@pytest.mark.django_db
def test_round_page_and_context_need_login(client, council_round):
    for url in (
        council_round.get_absolute_url(),
        reverse("council:context", args=[council_round.pk]),
    ):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")


@pytest.mark.django_db
def test_context_endpoint_serves_the_next_speakers_document(dad_client, council_round):
    response = dad_client.get(reverse("council:context", args=[council_round.pk]))
    doc = json.loads(response.content)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert doc["for"]["name"] == "Kit"  # after Ada and Grace
    assert [t["speaker"]["name"] for t in doc["turns"]] == ["Ada", "Grace"]


@pytest.mark.django_db
def test_context_endpoint_for_a_named_participant_and_an_unknown_one(
    dad_client, council_round
):
    ada = council_round.participants.get(name="Ada")
    url = reverse("council:context", args=[council_round.pk])
    assert json.loads(dad_client.get(f"{url}?participant={ada.pk}").content)["for"][
        "name"
    ] == ("Ada")
    assert dad_client.get(f"{url}?participant=999999").status_code == 404
    assert dad_client.get(f"{url}?participant=abc").status_code == 404


@pytest.mark.django_db
def test_every_ref_in_the_context_is_read_with_the_token_that_read_the_context(
    client, user, council_round
):
    """A participant holds a bearer token, not a browser session: the refs'
    addresses are the JSON API's, never a dashboard page that would send the
    token to the login form."""
    headers = {"Authorization": f"Bearer {token_create(user=user, name='ada').raw}"}
    doc = client.get(
        f"/api/v1/council/rounds/{council_round.pk}/context", headers=headers
    ).json()
    refs = [r for t in doc["turns"] for r in t["artifact_refs"]]
    assert refs
    for ref in refs:
        source = client.get(ref["source_url"], headers=headers)
        assert source.status_code == 200
        assert source["X-Pippa-Media-Type"] == ref["media_type"]
        body = b"".join(source.streaming_content)
        assert len(body) == ref["size"]
        preview = client.get(ref["preview_url"], headers=headers)
        assert preview.status_code == 200
        assert preview["X-Pippa-Media-Type"] == "image/png"
        assert b"".join(preview.streaming_content).startswith(b"\x89PNG")


@pytest.mark.django_db
def test_turn_context_endpoint_returns_the_stored_bytes_unchanged_by_later_turns(
    dad_client, council_round
):
    grace_turn = Turn.objects.get(round=council_round, order=2)
    url = reverse("council:turn_context", args=[grace_turn.pk])
    before = dad_client.get(url).content
    turn_add(
        council_round=council_round,
        participant=council_round.participants.get(name="Kit"),
        text="late",
    )
    after = dad_client.get(url).content
    assert before == after
    assert [t["order"] for t in json.loads(after)["turns"]] == [1]


@pytest.mark.django_db
def test_staff_may_open_any_round(client, make_user, council_round):
    client.force_login(make_user(is_staff=True))
    assert client.get(council_round.get_absolute_url()).status_code == 200


@pytest.mark.django_db
def test_round_page_queries_do_not_grow_with_the_number_of_turns(
    dad_client, council_round, django_assert_max_num_queries
):
    kit = council_round.participants.get(name="Kit")
    url = council_round.get_absolute_url()
    with django_assert_max_num_queries(12) as few:
        dad_client.get(url)
    for i in range(4):
        turn_add(council_round=council_round, participant=kit, text=f"more {i}")
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = dad_client.get(url)
    assert b"more 3" in response.content


@pytest.mark.django_db
def test_a_turn_context_is_cached_by_its_sha_and_a_repeat_view_is_304(
    dad_client, council_round
):
    grace_turn = Turn.objects.get(round=council_round, order=2)
    url = reverse("council:turn_context", args=[grace_turn.pk])
    first = dad_client.get(url)
    sha = grace_turn.artifact_links.get(role="context").artifact.sha256

    again = dad_client.get(url, headers={"If-None-Match": first["ETag"]})

    assert first["ETag"] == f'"{sha}"'
    assert first["Cache-Control"] == "private, max-age=31536000, immutable"
    assert again.status_code == 304
    assert again.content == b""


@pytest.mark.django_db
def test_the_live_round_context_is_never_cached(dad_client, council_round):
    response = dad_client.get(reverse("council:context", args=[council_round.pk]))
    assert response["Cache-Control"] == "private, no-store"
    assert "ETag" not in response


@pytest.mark.django_db
def test_another_users_turn_context_is_404_even_with_the_right_etag(
    client, make_user, council_round
):
    grace_turn = Turn.objects.get(round=council_round, order=2)
    sha = grace_turn.artifact_links.get(role="context").artifact.sha256
    client.force_login(make_user())
    response = client.get(
        reverse("council:turn_context", args=[grace_turn.pk]),
        headers={"If-None-Match": f'"{sha}"'},
    )
    assert response.status_code == 404


@pytest.mark.django_db
def test_a_round_leads_with_its_outcome_and_names_citations_by_title(client):
    from django.contrib.auth import get_user_model

    from council.demo import demo_round_load
    from council.models import Turn

    dad = get_user_model().objects.create_user("dad-outcome", password="x")
    client.force_login(dad)
    council_round = demo_round_load(owner=dad)
    last = Turn.objects.filter(round=council_round).order_by("-order").first()
    body = client.get(council_round.get_absolute_url()).content.decode()
    outcome = body.index('<section class="card outcome')
    assert outcome < body.index('id="participants-h"')
    # The demo's last speaker concluded it: the outcome comes first.
    assert "Act on basement flooding first" in body[outcome:]
    assert (
        f"Written by <bdi>{last.participant.name}</bdi>, who had the last word" in body
    )
    assert ">artifact " not in body.split('class="cites"')[-1][:400]
    assert "(JSON)" not in body.split("Details for an engineer")[0]


@pytest.mark.django_db
def test_a_round_nobody_spoke_in_says_there_is_no_conclusion_yet(client):
    from django.contrib.auth import get_user_model

    from council.demo import demo_round_load
    from council.models import Turn

    dad = get_user_model().objects.create_user("dad-empty", password="x")
    client.force_login(dad)
    council_round = demo_round_load(owner=dad)
    Turn.objects.filter(round=council_round).delete()
    type(council_round).objects.filter(pk=council_round.pk).update(
        outcome="", concluded_at=None, concluded_by=""
    )
    body = client.get(council_round.get_absolute_url()).content.decode()
    assert "<strong>No conclusion yet.</strong>\n  Nobody has spoken yet." in body
    assert "Write the outcome" not in body  # nothing to conclude yet


@pytest.mark.django_db
def test_a_citation_names_the_participant_whose_turn_made_it(client):
    from django.contrib.auth import get_user_model

    from council.demo import demo_round_load
    from council.models import TurnArtifact

    dad = get_user_model().objects.create_user("dad-cites", password="x")
    client.force_login(dad)
    council_round = demo_round_load(owner=dad)
    cited = TurnArtifact.objects.filter(
        turn__round=council_round, role=TurnArtifact.Role.CITED
    ).first()
    made = TurnArtifact.objects.get(
        turn__round=council_round,
        role=TurnArtifact.Role.PRODUCED,
        artifact_id=cited.artifact_id,
    )
    author = made.turn.participant.name

    body = client.get(council_round.get_absolute_url()).content.decode()

    cites = body.split('class="cites"')[1].split("</p>")[0]
    assert f"</a> by <bdi>{author}</bdi>" in cites
    assert cited.artifact.title in cites
