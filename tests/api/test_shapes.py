"""One artifact-ref shape and one task/step shape, for every door.

``tasks.shapes`` defines them; the API declares them as its response schemas
and ``tasks.documents`` builds every other door's dicts through them; the
resume context and the council's refs extend them without renaming a key.
"""

from __future__ import annotations

import pytest

from api.api import api
from council.services import participant_ref
from tasks.documents import (
    artifact_payload,
    artifact_ref,
    step_payload,
    task_payload,
    task_summary,
)
from tasks.models import Step
from tasks.plan import task_create
from tasks.resume_document import resume_payload
from tasks.shapes import (
    ArtifactOut,
    ArtifactRefOut,
    ConversationOut,
    ResumeOut,
    StepCompleteOut,
    StepOut,
    StepPageOut,
    StepRunOut,
    TaskOut,
    TaskSummaryOut,
)
from tests.support.executing import crash_at, expire_lease
from tests.support.plans import DEMO_PLAN


def _fields(schema) -> set[str]:
    return set(schema.model_fields)


@pytest.fixture
def half_done(make_conversation):
    """A task with two done steps (outputs stored) and two left to run."""
    task = task_create(conversation=make_conversation(), title="Chart", steps=DEMO_PLAN)
    crash_at(task.pk, "after_payload:3")
    expire_lease(task.pk)
    return task


def test_the_api_declares_the_shapes_themselves_not_copies():
    import api.api as module

    components = api.get_openapi_schema()["components"]["schemas"]
    for shape in (
        ArtifactOut,
        ArtifactRefOut,
        ConversationOut,
        StepOut,
        StepRunOut,
        StepPageOut,
        StepCompleteOut,
    ):
        assert set(components[shape.__name__]["properties"]) == _fields(shape)
    # The resume document's one key whose field has another name: "schema".
    assert set(components["ResumeOut"]["properties"]) == {
        field.alias or name for name, field in ResumeOut.model_fields.items()
    }
    # TaskOut is TaskSummaryOut's fields and the steps.
    assert set(components["TaskOut"]["properties"]) == _fields(TaskSummaryOut) | {
        "steps"
    }
    for shape in (
        ArtifactOut,
        ConversationOut,
        StepRunOut,
        TaskOut,
        ResumeOut,
        StepPageOut,
        StepCompleteOut,
    ):
        assert getattr(module, shape.__name__) is shape


def test_a_key_no_shape_declares_is_refused_not_dropped():
    with pytest.raises(ValueError, match="class"):
        ArtifactRefOut(
            id=1,
            sha256="0" * 64,
            artifact_class=2,
            **{"class": 2},
            class_label="fetch",
            media_type="text/plain",
            title="",
            size=0,
        )


@pytest.mark.django_db
def test_the_task_document_has_exactly_the_api_schemas_keys(half_done):
    doc = task_payload(half_done)
    done = next(s for s in doc["steps"] if s["output"])
    artifact = Step.objects.get(pk=done["id"]).output

    assert set(doc) == _fields(TaskOut)
    assert set(task_summary(half_done)) == _fields(TaskSummaryOut)
    assert {key for s in doc["steps"] for key in s} == _fields(StepOut)
    assert set(done["output"]) == _fields(ArtifactRefOut)
    assert set(artifact_payload(artifact)) == _fields(ArtifactOut)


@pytest.mark.django_db
def test_the_resume_context_and_a_council_ref_extend_the_same_shapes(half_done):
    context = resume_payload(half_done)
    document = task_payload(half_done)
    done = context["recent"][0]
    artifact = Step.objects.get(pk=done["id"]).output

    assert set(context["task"]) == _fields(TaskSummaryOut) | {
        "branched_from",
        "branched_after_step",
    }
    by_id = {s["id"]: s for s in document["steps"]}
    for entry in context["recent"]:
        step = by_id[entry["id"]]
        assert {k: entry[k] for k in ("position", "title", "status")} == {
            k: step[k] for k in ("position", "title", "status")
        }
        assert entry["output"] == step["output"]
    for entry in context["next"]:
        step = by_id[entry["id"]]
        shared = set(step) & set(entry)
        assert {k: entry[k] for k in shared} == {k: step[k] for k in shared}
        assert shared == set(step) - {"output"}
    assert set(done["output"]) == _fields(ArtifactRefOut)
    assert "class" not in done["output"]
    ref = participant_ref(artifact)
    assert {k: ref[k] for k in _fields(ArtifactRefOut)} == artifact_ref(artifact)
    assert step_payload(Step.objects.get(pk=done["id"])) == document["steps"][0]
