"""The adopted tables, indexes and constraints take this app's names."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelTable(name="notifysettings", table=None),
        migrations.AlterModelTable(name="notice", table=None),
        migrations.RenameIndex(model_name="notice", new_name="notifications_notice_due", old_name="tasks_notice_pending_due"),
        migrations.RenameIndex(model_name="notice", new_name="notifications_notice_sent", old_name="tasks_notice_owner_sent"),
        migrations.RenameIndex(model_name="notice", new_name="notifications_notice_step", old_name="tasks_notice_step"),
        migrations.RemoveConstraint(model_name="notice", name="tasks_notice_state_valid"),
        migrations.AddConstraint(
            model_name="notice",
            constraint=models.CheckConstraint(condition=models.Q(("state__in", ["pending", "sent", "dropped"])), name="notifications_notice_state_valid"),
        ),
        migrations.RemoveConstraint(model_name="notice", name="tasks_notice_one_pending_per_step"),
        migrations.AddConstraint(
            model_name="notice",
            constraint=models.UniqueConstraint(condition=models.Q(("state", "pending")), fields=("step",), name="notifications_notice_one_pending_per_step"),
        ),
    ]
