"""The notifications app adopts the outbox and the settings that the tasks app
made: rows written under the old schema are there, whole, after migrating."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from notifications.models import Notice, NotifySettings
from tests.support.migrating import migrate_back, migrate_forward

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("tasks", "0007_task_token_usage")


def test_notices_and_settings_written_by_the_tasks_app_survive_the_move():
    apps = migrate_back(BEFORE)
    try:
        User = apps.get_model("auth", "User")
        Conversation = apps.get_model("tasks", "Conversation")
        Task = apps.get_model("tasks", "Task")
        Step = apps.get_model("tasks", "Step")
        OldSettings = apps.get_model("tasks", "NotifySettings")
        OldNotice = apps.get_model("tasks", "Notice")
        dad = User.objects.create(username="dad")
        conversation = Conversation.objects.create(owner=dad, title="c")
        task = Task.objects.create(conversation=conversation, title="t")
        step = Step.objects.create(task=task, position=1, title="s", tool="demo.search")
        OldSettings.objects.create(user=dad, enabled=True, addresses="dad@example.org")
        sent = OldNotice.objects.create(
            owner=dad, step=step, reason="failed", state="sent", message_id=7
        )
        pending = OldNotice.objects.create(owner=dad, step=step, reason="needs_review")
    finally:
        # Forward whatever happened: the next test needs today's schema.
        migrate_forward()

    settings = NotifySettings.objects.get(user_id=dad.pk)
    assert (settings.enabled, settings.address_list) == (True, ["dad@example.org"])
    assert sorted(Notice.objects.values_list("pk", "state", "message_id")) == [
        (sent.pk, "sent", 7),
        (pending.pk, "pending", None),
    ]
    # The adopted table keeps its rule: one pending notice a step.
    with pytest.raises(IntegrityError), transaction.atomic():
        Notice.objects.create(owner_id=dad.pk, step_id=step.pk, reason="failed")
    assert Notice._meta.db_table == "notifications_notice"
