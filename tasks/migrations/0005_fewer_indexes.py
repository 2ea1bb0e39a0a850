"""Drop four foreign-key indexes that a unique or composite index already leads with.

Each index more is pages more in every step's commits (an event row is written
three times a step). Only the indexes go; the tables stay (SQLite would
otherwise rebuild them), hence state and database operations apart.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0004_task_cancelled_and_attention_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="step",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DB_CASCADE,
                        related_name="events",
                        to="tasks.step",
                    ),
                ),
                migrations.AlterField(
                    model_name="event",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DB_CASCADE,
                        related_name="events",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="step",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DB_CASCADE,
                        related_name="steps",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="taskartifact",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DB_CASCADE,
                        related_name="artifact_links",
                        to="tasks.task",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "tasks_event_step_id_aaef3e2e"',
                    reverse_sql='CREATE INDEX "tasks_event_step_id_aaef3e2e" ON "tasks_event" ("step_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "tasks_event_task_id_9f848980"',
                    reverse_sql='CREATE INDEX "tasks_event_task_id_9f848980" ON "tasks_event" ("task_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "tasks_step_task_id_d4ea36b6"',
                    reverse_sql='CREATE INDEX "tasks_step_task_id_d4ea36b6" ON "tasks_step" ("task_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "tasks_taskartifact_task_id_1f539989"',
                    reverse_sql='CREATE INDEX "tasks_taskartifact_task_id_1f539989" ON "tasks_taskartifact" ("task_id")',
                ),
            ],
        ),
    ]
