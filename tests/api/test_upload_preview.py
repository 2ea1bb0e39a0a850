"""A widget uploaded through the API gets its PNG preview after the commit,
exactly as a step's widget output does, or the reason it got none."""

from __future__ import annotations

import pytest
from django.urls import reverse

from artifacts.models import Artifact
from artifacts.preview import PREVIEW_MEDIA_TYPE
from tasks.models import Conversation, Task, TaskArtifact

pytestmark = pytest.mark.django_db

SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60">'
    b'<rect width="120" height="60" fill="#2f6f8f"/></svg>'
)


@pytest.fixture
def task(user):
    return Task.objects.create(
        conversation=Conversation.objects.create(owner=user, title="c"), title="t"
    )


def _upload(api_client, task, body, title="Chart"):
    return api_client.upload(
        f"/api/v1/tasks/{task.pk}/artifacts?artifact_class=4&title={title}",
        body,
        media_type="image/svg+xml",
    )


def test_an_uploaded_widget_gets_its_png_preview_linked_to_the_task(
    api_client, task, client, user
):
    response = _upload(api_client, task, SVG)

    assert response.status_code == 201
    widget = Artifact.objects.get(pk=response.json()["id"])
    preview = Artifact.objects.get(media_type=PREVIEW_MEDIA_TYPE)
    assert widget.meta["preview"]["status"] == "ok"
    assert widget.meta["preview"]["artifact_id"] == preview.pk
    assert list(preview.sources.all()) == [widget]
    assert preview.owner == user
    assert TaskArtifact.objects.filter(task=task, artifact=preview).exists()
    client.force_login(user)
    png = client.get(reverse("artifacts:preview", args=[widget.pk]))
    assert png.status_code == 200
    assert png["Content-Type"] == "image/png"


def test_an_uploaded_widget_that_cannot_render_records_why(
    api_client, task, client, user
):
    response = _upload(api_client, task, b"<svg", title="Broken")

    assert response.status_code == 201
    widget = Artifact.objects.get(pk=response.json()["id"])
    assert widget.meta["preview"]["status"] == "failed"
    reason = widget.meta["preview"]["reason"]
    assert reason
    assert not Artifact.objects.filter(media_type=PREVIEW_MEDIA_TYPE).exists()
    client.force_login(user)
    page = client.get(reverse("artifacts:detail", args=[widget.pk])).content.decode()
    assert reason in page
