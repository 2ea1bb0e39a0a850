"""Each user's stored bytes, kept by the schema (artifacts.models.StorageQuota).

Triggers on the artifact table add a row's size to its owner's count when the
row is inserted and take it off when it is deleted, whichever path does it;
the count starts from the rows there are.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


SQLITE = [
    """
    CREATE TRIGGER artifacts_storage_add AFTER INSERT ON artifacts_artifact
    BEGIN
        INSERT INTO artifacts_storagequota (owner_id, used_bytes)
        VALUES (NEW.owner_id, NEW.size)
        ON CONFLICT (owner_id)
        DO UPDATE SET used_bytes = used_bytes + excluded.used_bytes;
    END
    """,
    """
    CREATE TRIGGER artifacts_storage_remove AFTER DELETE ON artifacts_artifact
    BEGIN
        UPDATE artifacts_storagequota SET used_bytes = used_bytes - OLD.size
         WHERE owner_id = OLD.owner_id;
    END
    """,
]
SQLITE_UNDO = [
    "DROP TRIGGER IF EXISTS artifacts_storage_add",
    "DROP TRIGGER IF EXISTS artifacts_storage_remove",
]
POSTGRESQL = [
    """
    CREATE FUNCTION artifacts_storage_count() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO artifacts_storagequota (owner_id, used_bytes)
            VALUES (NEW.owner_id, NEW.size)
            ON CONFLICT (owner_id) DO UPDATE
               SET used_bytes = artifacts_storagequota.used_bytes + EXCLUDED.used_bytes;
            RETURN NEW;
        END IF;
        UPDATE artifacts_storagequota SET used_bytes = used_bytes - OLD.size
         WHERE owner_id = OLD.owner_id;
        RETURN OLD;
    END
    $$
    """,
    """
    CREATE TRIGGER artifacts_storage_count AFTER INSERT OR DELETE ON artifacts_artifact
    FOR EACH ROW EXECUTE FUNCTION artifacts_storage_count()
    """,
]
POSTGRESQL_UNDO = [
    "DROP TRIGGER IF EXISTS artifacts_storage_count ON artifacts_artifact",
    "DROP FUNCTION IF EXISTS artifacts_storage_count()",
]
BACKFILL = """
    INSERT INTO artifacts_storagequota (owner_id, used_bytes)
    SELECT owner_id, SUM(size) FROM artifacts_artifact GROUP BY owner_id
"""


def _run(schema_editor, statements) -> None:
    for statement in statements:
        schema_editor.execute(statement)


def count_from_rows(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    _run(schema_editor, [BACKFILL, *(POSTGRESQL if vendor == "postgresql" else SQLITE)])


def uncount(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    _run(schema_editor, POSTGRESQL_UNDO if vendor == "postgresql" else SQLITE_UNDO)


class Migration(migrations.Migration):

    dependencies = [
        ('artifacts', '0007_inline_blob_to_files'),
        ('auth', '0012_alter_user_first_name_max_length'),
    ]

    operations = [
        migrations.CreateModel(
            name='StorageQuota',
            fields=[
                ('owner', models.OneToOneField(on_delete=django.db.models.deletion.DB_CASCADE, primary_key=True, related_name='storage_quota', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('used_bytes', models.BigIntegerField(default=0)),
                ('limit_bytes', models.BigIntegerField(blank=True, help_text="Bytes this user may store; empty: the site's default (PIPPA_QUOTA_BYTES); 0: no limit.", null=True)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('limit_bytes__isnull', True), ('limit_bytes__gte', 0), _connector='OR'), name='artifacts_storagequota_limit_nonneg')],
            },
        ),
        migrations.RunPython(count_from_rows, uncount),
    ]
