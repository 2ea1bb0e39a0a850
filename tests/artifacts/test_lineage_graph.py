"""The artifact page draws its lineage as a small server-made SVG graph."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from artifacts.lineage_graph import MAX_PER_ROW, lineage_graph
from artifacts.models import ArtifactClass
from artifacts.selectors import artifact_lineage

pytestmark = pytest.mark.django_db


@pytest.fixture
def task(make_conversation, make_task, user):
    return make_task(conversation=make_conversation(owner=user), title="Chart closes")


@pytest.fixture
def kept(task, make_artifact):
    """Make an artifact of the task's owner that the task keeps."""

    def make(**kwargs):
        artifact = make_artifact(owner=task.conversation.owner, **kwargs)
        task.artifact_links.create(artifact=artifact)
        return artifact

    return make


def _svg(page: str) -> str:
    match = re.search(r'<svg class="lineage-svg".*?</svg>', page, re.S)
    assert match, "no lineage picture"
    return match[0]


def test_sources_are_drawn_above_and_derived_artifacts_below_with_arrows(
    dad_client, kept
):
    closes = kept(title="Closes", artifact_class=ArtifactClass.FETCH)
    news = kept(title="News", artifact_class=ArtifactClass.SNAPSHOT)
    chart = kept(
        title="Chart",
        artifact_class=ArtifactClass.RENDER,
        source_ids=[closes.pk, news.pk],
    )
    png = kept(title="Chart PNG", source_ids=[chart.pk])
    page = dad_client.get(reverse("artifacts:detail", args=[chart.pk])).content.decode()
    svg = _svg(page)
    links = {
        int(pk): re.sub(r"<[^>]+>", " ", inner).split()
        for pk, inner in re.findall(
            r'<a class="node" href="/artifacts/(\d+)/">(.*?)</a>', svg, re.S
        )
    }
    # What each is, in Dad's words (its class and id are an engineer's).
    assert links == {
        closes.pk: ["text", "Closes"],
        news.pk: ["text", "News"],
        png.pk: ["text", "Chart", "PNG"],
    }
    # The artifact itself is a box but not a link to itself.
    assert 'aria-label="Chart: text (this one)"' in svg
    assert svg.count('marker-end="url(#arrow)"') == 3
    tops = {
        title: int(y)
        for y, title in re.findall(
            r'<text class="name" x="\d+" y="(\d+)">([^<]+)</text>', svg
        )
    }
    assert tops["Closes"] == tops["News"] < tops["Chart"] < tops["Chart PNG"]
    assert "<script" not in svg
    assert " style=" not in svg  # the CSP forbids inline style


def test_an_artifact_without_lineage_has_no_picture(dad_client, kept):
    alone = kept(title="Alone")
    page = dad_client.get(reverse("artifacts:detail", args=[alone.pk])).content.decode()
    assert "lineage-svg" not in page
    assert "Nothing: it was not made from another result." in page


def test_hostile_titles_are_escaped_in_the_picture(dad_client, kept):
    source = kept(title='<script>alert("x")</script>')
    derived = kept(title="Made from it", source_ids=[source.pk])
    page = dad_client.get(
        reverse("artifacts:detail", args=[derived.pk])
    ).content.decode()
    svg = _svg(page)
    assert "<script>" not in svg
    assert "&lt;script&gt;alert(&quot;x&quot;)" in svg


def test_another_users_artifact_cannot_derive_from_yours_so_is_never_drawn(
    dad_client, kept, make_artifact, make_user
):
    from artifacts.services import ArtifactError

    mine = kept(title="Mine")
    with pytest.raises(ArtifactError):
        make_artifact(
            owner=make_user(), title="Nobody keeps this", source_ids=[mine.pk]
        )
    child = kept(title="Kept child", source_ids=[mine.pk])
    svg = _svg(
        dad_client.get(reverse("artifacts:detail", args=[mine.pk])).content.decode()
    )
    assert "Kept child" in svg
    assert "Nobody keeps this" not in svg
    assert f"/artifacts/{child.pk}/" in svg


def test_a_wide_lineage_draws_a_few_boxes_and_says_how_many_more(user, kept):
    root = kept(title="Root")
    for i in range(MAX_PER_ROW + 7):
        kept(title=f"child {i}", source_ids=[root.pk])
    graph = lineage_graph(
        artifact=root, lineage=artifact_lineage(artifact=root, user=user)
    )
    row = graph.rows[1]
    assert [box.artifact.title for box in row[:-1]] == [
        f"child {i}" for i in range(MAX_PER_ROW)
    ]
    assert row[-1].artifact is None
    assert row[-1].more == 7


def test_a_long_title_is_shortened_in_its_box_and_whole_in_the_list_under_it(
    dad_client, kept
):
    long_title = "Quarterly closes of every fund, revised"
    source = kept(title=long_title)
    untitled = kept(title="", source_ids=[source.pk])
    page = dad_client.get(
        reverse("artifacts:detail", args=[untitled.pk])
    ).content.decode()
    svg = _svg(page)
    names = re.findall(r'<text class="name" x="\d+" y="\d+">([^<]+)</text>', svg)
    # 22 characters, the ellipsis included; an untitled artifact is named by id.
    assert names == ["Quarterly closes of e…", f"Artifact {untitled.pk}"]
    assert f'aria-label="Artifact {untitled.pk}: text (this one)"' in svg
    assert f"<bdi>{long_title}</bdi>" in page.split("</svg>")[1]
