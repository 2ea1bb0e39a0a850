"""The executor's cheap transaction and cursor behave like Django's own."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from pippa_site.hotsql import hot_atomic, hot_cursor, joined_atomic
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
