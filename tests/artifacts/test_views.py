"""Artifact detail page and payload endpoints: login, owner check, safe serving."""

from __future__ import annotations

import json
import os
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from artifacts.models import Artifact, ArtifactClass
from artifacts.selectors import artifact_get_for_user, artifact_user_may_see
from artifacts.store import default_store
from council.services import round_start, turn_add, widget_store

SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="100" height="60">'
    b"<script>alert(1)</script><rect width='100' height='60'/></svg>"
)


@pytest.fixture
def owned(make_conversation, make_task, make_artifact, user):
    """A task of ``user`` that persisted an artifact."""
    conversation = make_conversation(owner=user, title="Mine")
    task = make_task(conversation=conversation, title="Fetch closes")
    artifact = make_artifact(
        owner=user,
        title="Closes",
        media_type="text/csv",
        artifact_class=ArtifactClass.FETCH,
    )
    task.artifact_links.create(artifact=artifact)
    return task, artifact


@pytest.mark.django_db
def test_detail_shows_the_content_first_and_hashes_only_under_details(
    dad_client, owned
):
    task, artifact = owned
    response = dad_client.get(reverse("artifacts:detail", args=[artifact.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    details = page.index('<details class="card engineer">')
    assert page.index('<pre class="source-text"') < details  # its text, first
    assert page.index(artifact.sha256) > details
    assert page.index("2 · fetch") > details
    assert "intact" in page
    assert reverse("artifacts:verify", args=[artifact.pk]) in page
    assert f'href="/artifacts/{artifact.pk}/source"' in page
    assert f'href="{reverse("dashboard:task", args=[task.pk])}"' in page
    assert "Fetch closes" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("artifact_class", "word"),
    [(1, "file"), (2, "fetch"), (3, "snapshot"), (4, "render")],
)
def test_detail_badge_names_each_class_in_words(
    dad_client, owned, make_artifact, artifact_class, word
):
    task, _ = owned
    artifact = make_artifact(
        owner=task.conversation.owner, artifact_class=artifact_class
    )
    task.artifact_links.create(artifact=artifact)
    page = dad_client.get(reverse("artifacts:detail", args=[artifact.pk])).content
    assert f"<dd>{artifact_class} · {word}</dd>".encode() in page


@pytest.mark.django_db
def test_verify_now_reports_a_corrupt_blob_and_records_it(dad_client, owned):
    _, artifact = owned
    path = default_store().path(artifact.sha256)
    os.chmod(path, 0o644)
    path.write_bytes(b"tampered")

    response = dad_client.post(
        reverse("artifacts:verify", args=[artifact.pk]), follow=True
    )

    assert response.status_code == 200
    assert b"does not match its sha256 (corrupt)" in response.content
    artifact.refresh_from_db()
    assert artifact.integrity == Artifact.Integrity.CORRUPT


@pytest.mark.django_db
def test_verify_now_confirms_an_intact_blob(dad_client, owned):
    _, artifact = owned
    response = dad_client.post(
        reverse("artifacts:verify", args=[artifact.pk]), follow=True
    )
    assert b"Verified: the blob matches its sha256." in response.content


@pytest.mark.django_db
def test_verify_needs_post(dad_client, owned):
    _, artifact = owned
    assert (
        dad_client.get(reverse("artifacts:verify", args=[artifact.pk])).status_code
        == 405
    )


@pytest.mark.django_db
def test_detail_shows_lineage_as_nested_lists_both_ways(
    dad_client, owned, make_artifact
):
    task, data = owned
    widget, preview = widget_store(
        owner=task.conversation.owner,
        data=SVG,
        title="Chart of closes",
        source_ids=[data.pk],
    )
    task.artifact_links.create(artifact=widget)
    task.artifact_links.create(artifact=preview)
    page = dad_client.get(reverse("artifacts:detail", args=[data.pk])).content.decode()
    derived = page[page.index("Made from it") :]
    assert "Chart of closes" in derived
    # The preview hangs under the widget: a nested list.
    assert derived.index("Chart of closes") < derived.index(
        "Preview of Chart of closes"
    )
    assert derived.count('<ul class="lineage">') >= 2

    page = dad_client.get(
        reverse("artifacts:detail", args=[preview.pk])
    ).content.decode()
    sources = page[page.index(">Made from<") : page.index("Made from it")]
    assert "Chart of closes" in sources
    assert "Closes" in sources


@pytest.mark.django_db
def test_detail_of_a_widget_shows_its_preview_image_or_why_it_failed(dad_client, owned):
    task, _ = owned
    good, _ = widget_store(owner=task.conversation.owner, data=SVG, title="good")
    bad, _ = widget_store(owner=task.conversation.owner, data=b"<svg", title="bad")
    task.artifact_links.create(artifact=good)
    task.artifact_links.create(artifact=bad)
    page = dad_client.get(reverse("artifacts:detail", args=[good.pk])).content.decode()
    assert f'<img class="detail-preview" src="/artifacts/{good.pk}/preview.png"' in page
    page = dad_client.get(reverse("artifacts:detail", args=[bad.pk])).content.decode()
    assert "<strong>No picture:</strong> drawing it failed (malformed XML" in page


@pytest.mark.django_db
def test_source_of_an_svg_is_a_sandboxed_nosniff_download(dad_client, owned):
    task, _ = owned
    widget, _ = widget_store(owner=task.conversation.owner, data=SVG)
    task.artifact_links.create(artifact=widget)

    response = dad_client.get(reverse("artifacts:source", args=[widget.pk]))

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == SVG
    assert response["Content-Type"] == "image/svg+xml"
    assert "sandbox" in response["Content-Security-Policy"]
    assert "default-src 'none'" in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"].startswith("attachment;")


@pytest.mark.django_db
def test_source_of_html_is_a_download_too(dad_client, owned):
    task, _ = owned
    page, _ = widget_store(
        owner=task.conversation.owner,
        data=b"<html><body>" + SVG + b"</body></html>",
        media_type="text/html",
    )
    task.artifact_links.create(artifact=page)
    response = dad_client.get(reverse("artifacts:source", args=[page.pk]))
    assert response["Content-Disposition"].startswith("attachment;")
    assert "sandbox" in response["Content-Security-Policy"]


@pytest.mark.django_db
def test_preview_is_an_inline_png_and_a_repeat_is_not_modified(dad_client, owned):
    task, _ = owned
    widget, preview = widget_store(owner=task.conversation.owner, data=SVG)
    task.artifact_links.create(artifact=widget)
    url = reverse("artifacts:preview", args=[widget.pk])

    response = dad_client.get(url)

    assert response["Content-Type"] == "image/png"
    assert response["Content-Disposition"].startswith("inline;")
    assert response["ETag"] == f'"{preview.sha256}"'
    again = dad_client.get(url, headers={"If-None-Match": response["ETag"]})
    assert again.status_code == 304


@pytest.mark.django_db
def test_preview_of_an_artifact_without_one_is_404(dad_client, owned):
    _, artifact = owned
    assert (
        dad_client.get(reverse("artifacts:preview", args=[artifact.pk])).status_code
        == 404
    )


@pytest.mark.django_db
def test_source_text_page_shows_the_svg_escaped_never_as_markup(dad_client, owned):
    task, _ = owned
    widget, _ = widget_store(owner=task.conversation.owner, data=SVG)
    task.artifact_links.create(artifact=widget)

    page = dad_client.get(
        reverse("artifacts:source_text", args=[widget.pk])
    ).content.decode()

    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page


@pytest.mark.django_db
def test_a_missing_blob_is_404_on_source_and_said_on_the_text_page(dad_client, owned):
    _, artifact = owned
    default_store().unlink(artifact.sha256)
    assert (
        dad_client.get(reverse("artifacts:source", args=[artifact.pk])).status_code
        == 404
    )
    page = dad_client.get(reverse("artifacts:source_text", args=[artifact.pk])).content
    assert b"missing from the blob store" in page


@pytest.mark.django_db
def test_another_users_artifact_is_404_on_every_endpoint(client, make_user, owned):
    _, artifact = owned
    client.force_login(make_user())
    for name in ("detail", "source", "source_text", "preview"):
        assert (
            client.get(reverse(f"artifacts:{name}", args=[artifact.pk])).status_code
            == 404
        )
    assert (
        client.post(reverse("artifacts:verify", args=[artifact.pk])).status_code == 404
    )
    assert client.get(reverse("artifacts:detail", args=[999999])).status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("artifact_id", [2**63 - 1, 2**63, 10**23])
def test_an_id_past_any_row_is_404_not_a_server_error(dad_client, artifact_id):
    for name in ("detail", "source", "source_text", "preview"):
        url = reverse(f"artifacts:{name}", args=[artifact_id])
        assert dad_client.get(url).status_code == 404, name


@pytest.mark.django_db
def test_artifact_endpoints_need_login(client, owned):
    _, artifact = owned
    response = client.get(reverse("artifacts:source", args=[artifact.pk]))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.django_db
def test_staff_see_every_artifact(client, make_user, owned):
    _, artifact = owned
    client.force_login(make_user(is_staff=True))
    assert (
        client.get(reverse("artifacts:detail", args=[artifact.pk])).status_code == 200
    )


@pytest.mark.django_db
def test_a_user_sees_their_own_rows_and_their_lineage_and_nobody_else_does(
    user, make_user, make_artifact, make_conversation
):
    raw = make_artifact(owner=user, title="raw")
    middle = make_artifact(owner=user, title="middle", source_ids=[raw.pk])
    council_round = round_start(
        conversation=make_conversation(owner=user),
        topic="t",
        participants=[("Ada", "claude")],
    )
    turn_add(
        council_round=council_round,
        participant=council_round.participants.get(),
        text="",
        widget=SVG,
        widget_source_ids=[middle.pk],
    )
    widget = Artifact.objects.get(owner=user, media_type="image/svg+xml")

    assert artifact_get_for_user(user=user, artifact_id=raw.pk) == raw
    assert artifact_user_may_see(user=user, artifact_id=middle.pk)
    assert list(widget.sources.all()) == [middle]
    stranger = make_user()
    for artifact in (raw, middle, widget):
        assert not artifact_user_may_see(user=stranger, artifact_id=artifact.pk)


@pytest.mark.django_db
def test_another_user_cannot_derive_from_an_artifact_that_is_not_theirs(
    dad_client, owned, make_artifact, make_user
):
    from artifacts.services import ArtifactError

    _, data = owned
    with pytest.raises(ArtifactError, match="source artifact does not exist"):
        make_artifact(
            owner=make_user(), title="Their secret chart", source_ids=[data.pk]
        )
    page = dad_client.get(reverse("artifacts:detail", args=[data.pk])).content
    assert b"Their secret chart" not in page
    assert b"Nothing was made from it." in page


@pytest.mark.django_db
def test_source_answers_head_requests_with_the_same_headers(dad_client, owned):
    _, artifact = owned
    response = dad_client.head(reverse("artifacts:source", args=[artifact.pk]))
    assert response.status_code == 200
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response["Content-Security-Policy"]


@pytest.mark.django_db
def test_source_carries_its_sha_as_etag_and_is_cacheable_for_good(dad_client, owned):
    _, artifact = owned
    response = dad_client.get(reverse("artifacts:source", args=[artifact.pk]))
    assert response.status_code == 200
    assert response["ETag"] == f'"{artifact.sha256}"'
    assert response["Cache-Control"] == "private, max-age=31536000, immutable"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    [
        '"{sha}"',
        'W/"{sha}"',
        '"0000", "{sha}"',
        "*",
    ],
)
def test_a_repeat_view_of_a_source_is_304_without_a_body(dad_client, owned, header):
    _, artifact = owned
    response = dad_client.get(
        reverse("artifacts:source", args=[artifact.pk]),
        headers={"If-None-Match": header.format(sha=artifact.sha256)},
    )
    assert response.status_code == 304
    assert response.content == b""
    assert response["ETag"] == f'"{artifact.sha256}"'
    assert response["Cache-Control"] == "private, max-age=31536000, immutable"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    ['"0000"', "{sha}", '"{sha}x"', "garbage, ,,", '"' + "a" * 5000 + '"'],
)
def test_a_stale_or_hostile_if_none_match_gets_the_bytes(dad_client, owned, header):
    _, artifact = owned
    response = dad_client.get(
        reverse("artifacts:source", args=[artifact.pk]),
        headers={"If-None-Match": header.format(sha=artifact.sha256)},
    )
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == default_store().get(artifact.sha256)


@pytest.mark.django_db
def test_another_user_holding_the_right_etag_still_gets_404(client, make_user, owned):
    task, artifact = owned
    widget, preview = widget_store(owner=task.conversation.owner, data=SVG)
    task.artifact_links.create(artifact=widget)
    client.force_login(make_user())
    for name, target, sha in (
        ("source", artifact, artifact.sha256),
        ("preview", widget, preview.sha256),
    ):
        response = client.get(
            reverse(f"artifacts:{name}", args=[target.pk]),
            headers={"If-None-Match": f'"{sha}"'},
        )
        assert response.status_code == 404, name


@pytest.mark.django_db
def test_a_repeat_view_of_a_preview_reads_neither_the_preview_row_nor_its_blob(
    dad_client, owned
):
    task, _ = owned
    widget, preview = widget_store(owner=task.conversation.owner, data=SVG)
    task.artifact_links.create(artifact=widget)
    url = reverse("artifacts:preview", args=[widget.pk])
    with CaptureQueriesContext(connection) as first:
        assert dad_client.get(url).status_code == 200
    default_store().unlink(preview.sha256)

    with CaptureQueriesContext(connection) as repeat:
        response = dad_client.get(url, headers={"If-None-Match": f'"{preview.sha256}"'})

    assert response.status_code == 304
    # The session, the user and the artifact row (its owner is on the row).
    assert len(repeat) == 3 < len(first)
    # The bytes are gone: a client without them is told so.
    assert dad_client.get(url).status_code == 404


@pytest.mark.django_db
def test_a_png_preview_is_sent_uncompressed_with_its_strong_etag(dad_client, owned):
    task, _ = owned
    widget, preview = widget_store(owner=task.conversation.owner, data=SVG)
    task.artifact_links.create(artifact=widget)
    response = dad_client.get(
        reverse("artifacts:preview", args=[widget.pk]),
        headers={"Accept-Encoding": "gzip, br"},
    )
    assert "Content-Encoding" not in response
    assert response["ETag"] == f'"{preview.sha256}"'
    assert b"".join(response.streaming_content).startswith(b"\x89PNG")


def _outside_the_fold(page: str) -> str:
    """The page's main text, without the engineer's folds."""
    main = page[page.index("<main") :]
    return re.sub(r'<details class="[^"]*engineer.*?</details>', "", main, flags=re.S)


@pytest.mark.django_db
def test_a_saved_search_reads_as_its_headlines_and_its_json_stays_folded(
    dad_client, owned, make_artifact, user
):
    task, _ = owned
    search = make_artifact(
        owner=user,
        title="Search: PIPA dividend",
        media_type="application/json",
        data=json.dumps(
            {
                "query": "PIPA dividend",
                "results": [
                    {
                        "title": "Pippa Paper opens a second mill",
                        "url": "https://x.test/1",
                    },
                    {"title": "PIPA raises its dividend"},
                ],
            }
        ).encode(),
    )
    other = make_artifact(
        owner=user, title="Settings", media_type="application/json", data=b'{"a": 1}'
    )
    task.artifact_links.create(artifact=search)
    task.artifact_links.create(artifact=other)

    page = dad_client.get(
        reverse("artifacts:detail", args=[search.pk])
    ).content.decode()
    data_page = dad_client.get(
        reverse("artifacts:detail", args=[other.pk])
    ).content.decode()

    shown = _outside_the_fold(page)
    assert "<li><bdi>Pippa Paper opens a second mill</bdi>" in shown
    assert "<li><bdi>PIPA raises its dividend</bdi></li>" in shown
    assert "{" not in re.sub(r"<[^>]+>", "", shown)
    assert "application/json" not in shown
    data_shown = _outside_the_fold(data_page)
    assert "Data for a program to read" in data_shown
    assert "{" not in re.sub(r"<[^>]+>", "", data_shown)
    assert "&quot;a&quot;: 1" in data_page  # under the engineer's fold
