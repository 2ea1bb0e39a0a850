"""Small payloads kept in the database (``InlineBlob``, see ``artifacts.store``)."""

import django.db.models.deletion
import django.db.models.functions.text
import django.db.models.lookups
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('artifacts', '0005_artifact_owner_required'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # The owner's own index goes: the unique (owner, sha256) index leads
        # with it. Only the index is dropped (SQLite would rebuild the table).
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='artifact',
                    name='owner',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='artifacts', to=settings.AUTH_USER_MODEL),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "artifacts_artifact_owner_id_9d4790dd"',
                    reverse_sql='CREATE INDEX "artifacts_artifact_owner_id_9d4790dd" ON "artifacts_artifact" ("owner_id")',
                ),
            ],
        ),
        migrations.CreateModel(
            name='InlineBlob',
            fields=[
                ('sha256', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('size', models.PositiveIntegerField()),
                ('data', models.BinaryField()),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=django.db.models.lookups.Exact(django.db.models.functions.text.Length('sha256'), 64), name='artifacts_inlineblob_sha256_len')],
            },
        ),
    ]
