"""The schema itself carries the cascade from conversation down, and the constraints."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from artifacts.models import Artifact
from tasks.models import Event, Step, Task

# (child table, fk column, parent table) that must be ON DELETE CASCADE in the schema.
CASCADES = [
    ("tasks_task", "conversation_id", "tasks_conversation"),
    ("tasks_step", "task_id", "tasks_task"),
    ("tasks_event", "task_id", "tasks_task"),
    ("tasks_event", "step_id", "tasks_step"),
    ("tasks_taskartifact", "task_id", "tasks_task"),
    ("tasks_taskartifact", "step_id", "tasks_step"),
    ("notifications_notice", "step_id", "tasks_step"),
    ("council_councilround", "conversation_id", "tasks_conversation"),
    ("council_participant", "round_id", "council_councilround"),
    ("council_turn", "round_id", "council_councilround"),
    ("council_turnartifact", "turn_id", "council_turn"),
    ("artifacts_artifactsource", "artifact_id", "artifacts_artifact"),
]
# Refs to artifacts must refuse the delete (NO ACTION), never cascade or null.
RESTRICTS = [
    ("tasks_step", "output_id", "artifacts_artifact"),
    ("tasks_taskartifact", "artifact_id", "artifacts_artifact"),
    ("council_turnartifact", "artifact_id", "artifacts_artifact"),
    ("artifacts_artifactsource", "source_id", "artifacts_artifact"),
    ("tasks_conversation", "owner_id", "auth_user"),
]


def delete_rules() -> dict[tuple[str, str], tuple[str, str]]:
    """Return {(table, column): (parent table, ON DELETE rule)} read from the schema."""
    rules = {}
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            tables = connection.introspection.table_names(cursor)
            for table in tables:
                cursor.execute(f'PRAGMA foreign_key_list("{table}")')
                for row in cursor.fetchall():
                    # id, seq, table, from, to, on_update, on_delete, match
                    rules[(table, row[3])] = (row[2], row[6].upper())
        else:
            cursor.execute(
                """
                SELECT kcu.table_name, kcu.column_name, ccu.table_name, rc.delete_rule
                FROM information_schema.referential_constraints rc
                JOIN information_schema.key_column_usage kcu
                  ON kcu.constraint_name = rc.constraint_name
                 AND kcu.constraint_schema = rc.constraint_schema
                JOIN information_schema.constraint_column_usage ccu
                  ON ccu.constraint_name = rc.unique_constraint_name
                 AND ccu.constraint_schema = rc.unique_constraint_schema
                WHERE rc.constraint_schema = current_schema()
                """
            )
            for table, column, parent, rule in cursor.fetchall():
                rules[(table, column)] = (parent, rule.upper())
    return rules


@pytest.mark.django_db
@pytest.mark.parametrize(("table", "column", "parent"), CASCADES)
def test_foreign_key_cascades_in_the_schema(table, column, parent):
    rules = delete_rules()
    assert rules[(table, column)] == (parent, "CASCADE")


@pytest.mark.django_db
@pytest.mark.parametrize(("table", "column", "parent"), RESTRICTS)
def test_refs_to_artifacts_and_owners_refuse_deletion_in_the_schema(
    table, column, parent
):
    rules = delete_rules()
    assert rules[(table, column)] == (parent, "NO ACTION")


@pytest.mark.django_db
def test_task_branch_pointer_is_set_null_in_the_schema():
    assert delete_rules()[("tasks_task", "branched_from_id")] == (
        "tasks_task",
        "SET NULL",
    )


@pytest.mark.django_db
def test_step_positions_are_unique_per_task(make_task):
    task = make_task()
    Step.objects.create(task=task, position=1, title="a", tool="t")
    with pytest.raises(IntegrityError), transaction.atomic():
        Step.objects.create(task=task, position=1, title="b", tool="t")


@pytest.mark.django_db
def test_event_sequence_is_unique_per_task(make_task):
    task = make_task()
    Event.objects.create(task=task, seq=1, kind="x")
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(task=task, seq=1, kind="y")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model", "fields"),
    [
        (Task, {"status": "exploded"}),
        (Step, {"status": "halfway"}),
        (Step, {"artifact_class": 5}),
    ],
)
def test_status_and_class_values_are_checked_by_the_database(model, fields, make_task):
    task = make_task()
    if model is Task:
        row = Task(conversation=task.conversation, title="t", **fields)
    else:
        row = Step(task=task, position=9, title="s", tool="t", **fields)
    with pytest.raises(IntegrityError), transaction.atomic():
        row.save()


@pytest.mark.django_db
def test_artifact_sha_is_unique_per_owner_and_class_checked(make_user):
    alice, bob = make_user(), make_user()
    Artifact.objects.create(owner=alice, sha256="a" * 64, size=1, artifact_class=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Artifact.objects.create(owner=alice, sha256="a" * 64, size=1, artifact_class=1)
    # Another owner's row over the same bytes is allowed: rows are owned.
    Artifact.objects.create(owner=bob, sha256="a" * 64, size=1, artifact_class=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Artifact.objects.create(sha256="c" * 64, size=1, artifact_class=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Artifact.objects.create(owner=alice, sha256="b" * 64, size=1, artifact_class=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Artifact.objects.create(owner=alice, sha256="short", size=1, artifact_class=1)


@pytest.mark.django_db
def test_a_done_step_must_have_an_output_ref(make_task):
    task = make_task()
    with pytest.raises(IntegrityError), transaction.atomic():
        Step.objects.create(task=task, position=1, title="s", tool="t", status="done")


@pytest.mark.django_db(transaction=True)
def test_deleting_a_conversation_row_in_sql_removes_its_subtree(make_task):
    """The database, not Python, removes tasks, steps and events."""
    task = make_task()
    step = Step.objects.create(task=task, position=1, title="s", tool="t")
    Event.objects.create(task=task, step=step, seq=1, kind="x")
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM tasks_conversation WHERE id = %s", [task.conversation_id]
        )
    assert not Task.objects.exists()
    assert not Step.objects.exists()
    assert not Event.objects.exists()
