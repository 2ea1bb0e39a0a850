"""The models' own rules: what "finished" means for a step (``Step.Status`` owns it, spelled once), a status in words."""

from __future__ import annotations

import pytest
from django.db import connection

from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from tasks.models import Step, Task


def test_a_finished_step_is_done_or_skipped_and_nothing_else():
    assert set(Step.Status.finished()) == {"done", "skipped"}
    for status in Step.Status.values:
        step = Step(status=status)
        assert step.is_finished == (status in ("done", "skipped")), status


@pytest.mark.django_db
def test_finished_and_not_done_split_a_tasks_steps_in_sql_as_in_python(make_task, user):
    task = make_task()
    output = artifact_store(
        owner=user, data=b"x", media_type="text/plain",
        artifact_class=ArtifactClass.SNAPSHOT,
    )  # fmt: skip
    for position, status in enumerate(Step.Status.values, start=1):
        Step.objects.create(
            task=task, position=position, title=status, tool="t", status=status,
            output=output if status == "done" else None,
        )  # fmt: skip
    steps = Step.objects.filter(task=task)
    table = connection.ops.quote_name(Step._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT title FROM {table} WHERE task_id = %s"
            f" AND status NOT IN {Step.Status.sql_list(Step.Status.finished())}",
            [task.pk],
        )
        by_sql = {row[0] for row in cursor.fetchall()}

    finished = set(steps.finished().values_list("status", flat=True))
    unfinished = set(steps.not_done().values_list("status", flat=True))
    assert finished == {"done", "skipped"}
    assert unfinished == set(Step.Status.values) - finished
    assert by_sql == unfinished


@pytest.mark.parametrize("model", [Task, Step])
def test_a_status_in_words_is_djangos_own_for_every_choice_and_any_other_value(model):
    field = model._meta.get_field("status")
    for value in [*(v for v, _ in field.choices), "not-a-status"]:
        row = model(status=value)
        assert row.get_status_display() == row._get_FIELD_display(field), value
