"""The notification settings and the outbox, adopted from the tasks app.

Their tables were made by tasks.0006 (``tasks_notifysettings``,
``tasks_notice``); this migration takes them into this app's state without
touching the database, and 0002 renames them."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("tasks", "0008_notifications_to_their_app"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="NotifySettings",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("enabled", models.BooleanField(default=False)),
                        ("addresses", models.TextField(blank=True, default="")),
                        ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("user", models.OneToOneField(on_delete=django.db.models.deletion.DB_CASCADE, related_name="notify_settings", to=settings.AUTH_USER_MODEL)),
                    ],
                    options={"db_table": "tasks_notifysettings"},
                ),
                migrations.CreateModel(
                    name="Notice",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("reason", models.CharField(max_length=16)),
                        ("state", models.CharField(choices=[("pending", "waiting to be sent"), ("sent", "sent"), ("dropped", "dropped")], default="pending", max_length=8)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("due_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("message_id", models.PositiveBigIntegerField(blank=True, null=True)),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        ("claimed_by", models.CharField(blank=True, default="", max_length=200)),
                        ("claimed_until", models.DateTimeField(blank=True, null=True)),
                        ("sent_at", models.DateTimeField(blank=True, null=True)),
                        ("note", models.CharField(blank=True, default="", max_length=300)),
                        ("owner", models.ForeignKey(on_delete=django.db.models.deletion.DB_CASCADE, related_name="+", to=settings.AUTH_USER_MODEL)),
                        ("step", models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.DB_CASCADE, related_name="notices", to="tasks.step")),
                    ],
                    options={
                        "db_table": "tasks_notice",
                        "indexes": [
                            models.Index(condition=models.Q(("state", "pending")), fields=["due_at"], name="tasks_notice_pending_due"),
                            models.Index(condition=models.Q(("state", "sent")), fields=["owner", "sent_at"], name="tasks_notice_owner_sent"),
                            models.Index(fields=["step"], name="tasks_notice_step"),
                        ],
                        "constraints": [
                            models.CheckConstraint(condition=models.Q(("state__in", ["pending", "sent", "dropped"])), name="tasks_notice_state_valid"),
                            models.UniqueConstraint(condition=models.Q(("state", "pending")), fields=("step",), name="tasks_notice_one_pending_per_step"),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
