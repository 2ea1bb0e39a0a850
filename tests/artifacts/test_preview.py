"""preview_render: the PNG preview of a widget, rendered once, failing closed."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from artifacts.models import Artifact, ArtifactClass, ArtifactSource
from artifacts.preview import (
    CAPS,
    REASON_BLOB_MISSING,
    preview_artifact_for,
    preview_render,
    render_png,
)
from artifacts.services import artifact_store
from artifacts.store import default_store

WIDE_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 400 100">'
    b'<rect width="400" height="100" fill="#2f5fd0"/></svg>'
)


def _owner():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username="widget-owner")[0]


def _widget(data: bytes = WIDE_SVG, media_type: str = "image/svg+xml") -> Artifact:
    return artifact_store(
        owner=_owner(),
        data=data,
        media_type=media_type,
        artifact_class=ArtifactClass.RENDER,
        title="w",
    )


@pytest.mark.django_db
def test_preview_render_stores_a_png_derived_from_the_widget():
    widget = _widget()

    preview = preview_render(artifact=widget)

    assert preview.media_type == "image/png"
    assert preview.artifact_class == ArtifactClass.RENDER
    assert preview.title == "Preview of w"
    assert list(
        ArtifactSource.objects.filter(artifact=preview).values_list(
            "source_id", flat=True
        )
    ) == [widget.pk]
    widget.refresh_from_db()
    assert widget.meta["preview"]["status"] == "ok"
    assert preview_artifact_for(widget) == preview


@pytest.mark.django_db
def test_the_preview_keeps_the_widgets_aspect_ratio_within_the_thumbnail_size():
    preview = preview_render(artifact=_widget())
    with Image.open(io.BytesIO(default_store().get(preview.sha256))) as image:
        width, height = image.size
    assert width == CAPS["thumb_side"]
    assert height == CAPS["thumb_side"] // 4


@pytest.mark.django_db
def test_rendering_the_same_widget_again_reuses_its_preview(monkeypatch):
    widget = _widget()
    first = preview_render(artifact=widget)
    monkeypatch.setattr(
        "artifacts.preview.render_png",
        lambda **kw: pytest.fail("rendered twice"),
    )
    assert preview_render(artifact=widget) == first
    assert Artifact.objects.filter(media_type="image/png").count() == 1


@pytest.mark.django_db
def test_an_artifact_that_is_not_a_widget_gets_no_preview_and_no_record():
    text = artifact_store(
        owner=_owner(), data=b"hello", media_type="text/plain", artifact_class=3
    )
    assert preview_render(artifact=text) is None
    text.refresh_from_db()
    assert "preview" not in text.meta


@pytest.mark.django_db
def test_a_widget_whose_blob_is_gone_records_a_failed_preview():
    widget = _widget()
    default_store().unlink(widget.sha256)
    assert preview_render(artifact=widget) is None
    widget.refresh_from_db()
    assert widget.meta["preview"] == {"status": "failed", "reason": REASON_BLOB_MISSING}


@pytest.mark.django_db
def test_a_failed_preview_keeps_other_metadata_of_the_widget():
    widget = artifact_store(
        owner=_owner(),
        data=b"<svg",
        media_type="image/svg+xml",
        artifact_class=4,
        meta={"tool": "chart"},
    )
    preview_render(artifact=widget)
    widget.refresh_from_db()
    assert widget.meta["tool"] == "chart"
    assert widget.meta["preview"]["status"] == "failed"


def test_render_png_refuses_a_media_type_it_does_not_render():
    result = render_png(data=b"%PDF-1.7", media_type="application/pdf")
    assert result.ok is False
    assert result.reason == "not a widget (SVG or HTML)"


def test_render_png_passes_no_secrets_to_the_worker(monkeypatch):
    from artifacts import preview

    seen = {}
    real = preview.subprocess.Popen

    def spy(args, **kwargs):
        seen["env"] = kwargs["env"]
        seen["args"] = args
        return real(args, **kwargs)

    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/x")
    monkeypatch.setattr(preview.subprocess, "Popen", spy)
    assert render_png(data=WIDE_SVG, media_type="image/svg+xml").ok
    assert "DATABASE_URL" not in seen["env"]
    assert "SECRET_KEY" not in seen["env"]
    assert seen["args"][1] == "-I"


@pytest.mark.django_db
def test_a_preview_whose_png_was_lost_is_rendered_again_into_the_same_row():
    widget = _widget()
    first = preview_render(artifact=widget)
    store = default_store()
    store.unlink(first.sha256)

    again = preview_render(artifact=widget)

    assert again == first
    assert store.verify(first.sha256)
    assert Artifact.objects.filter(media_type="image/png").count() == 1
