"""The executor's cheap transaction and cursor behave like Django's own."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from artifacts.models import Artifact
from pippa_site.hotsql import hot_atomic, hot_cursor, joined_atomic, row_get
from tasks.models import Conversation


def titles() -> set[str]:
    return set(Conversation.objects.values_list("title", flat=True))


@pytest.fixture
def owner(make_user):
    return make_user(username="hot")


def insert(owner, title: str) -> None:
    with hot_cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_conversation (owner_id, title, created_at, updated_at) "
            "VALUES (%s, %s, '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
            [owner.pk, title],
        )


@pytest.mark.django_db(transaction=True)
def test_a_block_commits_and_runs_its_on_commit_hooks_after_the_commit(owner):
    ran = []
    with hot_atomic():
        insert(owner, "kept")
        transaction.on_commit(lambda: ran.append(titles()))
        assert connection.in_atomic_block
        assert ran == []
    assert ran == [{"kept"}]
    assert not connection.in_atomic_block
    assert connection.get_autocommit()


@pytest.mark.django_db(transaction=True)
def test_an_exception_rolls_back_everything_and_drops_the_hooks(owner):
    ran = []

    def failing():
        with hot_atomic():
            insert(owner, "lost")
            transaction.on_commit(lambda: ran.append(1))
            raise ValueError("tool failed")

    with pytest.raises(ValueError, match="tool"):
        failing()
    assert titles() == set()
    assert ran == []
    assert connection.get_autocommit()
    insert(owner, "after")  # the connection is usable again
    assert titles() == {"after"}


@pytest.mark.django_db(transaction=True)
def test_set_rollback_and_a_failed_inner_savepoint_behave_as_in_django(owner):
    with hot_atomic():
        insert(owner, "marked")
        transaction.set_rollback(True)
    assert titles() == set()

    def inner():
        with transaction.atomic():
            insert(owner, "inner")
            insert(owner, None)  # NOT NULL: the savepoint rolls back

    with hot_atomic():
        insert(owner, "outer")
        with pytest.raises(IntegrityError):
            inner()
    assert titles() == {"outer"}


@pytest.mark.django_db(transaction=True)
def test_a_failure_in_a_joined_block_marks_the_whole_transaction_for_rollback(owner):
    def broken():
        with joined_atomic(), hot_cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    def block():
        with hot_atomic():
            insert(owner, "first")
            with pytest.raises(DatabaseError):
                broken()
            # Django refuses more statements in a transaction marked for rollback.
            Conversation.objects.count()

    with pytest.raises(transaction.TransactionManagementError):
        block()
    assert titles() == set()


@pytest.mark.django_db(transaction=True)
def test_driver_errors_arrive_as_django_errors_and_statements_are_logged(owner):
    with pytest.raises(IntegrityError):
        insert(owner, None)
    with CaptureQueriesContext(connection) as captured:
        insert(owner, "logged")
    assert any("'logged'" in q["sql"] for q in captured.captured_queries)


@pytest.mark.django_db
def test_inside_a_test_transaction_it_is_a_savepoint(owner):
    # An outer block (the test's): hot_atomic is transaction.atomic itself.
    def undone():
        with hot_atomic():
            insert(owner, "inner")
            raise ValueError("undo")

    with pytest.raises(ValueError, match="undo"):
        undone()
    insert(owner, "kept")
    assert titles() == {"kept"}


@pytest.mark.django_db
def test_a_row_read_by_id_is_the_instance_the_orm_would_give(make_artifact, make_user):
    artifact = make_artifact(meta={"preview": {"sha256": "ab" * 32}, "n": [1, 2]})
    user = make_user(username="row-get", is_staff=True)

    for model, pk in ((Artifact, artifact.pk), (get_user_model(), user.pk)):
        expected = model.objects.get(pk=pk)
        got = row_get(model, pk)
        assert type(got) is model
        for field in model._meta.concrete_fields:
            name = field.attname
            assert getattr(got, name) == getattr(expected, name), name
            assert type(getattr(got, name)) is type(getattr(expected, name)), name
        assert got._state.adding is False
        assert got._state.db == "default"
    # Converted as the ORM converts: JSON decoded, dates aware, booleans bool.
    got = row_get(Artifact, artifact.pk)
    assert got.meta["n"] == [1, 2]
    assert got.created_at.tzinfo is not None
    assert row_get(get_user_model(), user.pk).is_staff is True


@pytest.mark.django_db
@pytest.mark.parametrize("pk", [0, -1, 2**63 - 1, 2**63, -(2**63) - 1, 10**30])
def test_a_row_read_by_an_id_no_row_has_is_none(pk):
    assert row_get(Artifact, pk) is None
