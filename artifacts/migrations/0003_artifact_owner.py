"""Artifact rows get an owner (filled by 0004, required by 0005)."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("artifacts", "0002_pending_unlink"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="artifact",
            name="owner",
            field=models.ForeignKey(
                null=True,
                on_delete=models.deletion.DO_NOTHING,
                related_name="artifacts",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="artifact",
            name="sha256",
            field=models.CharField(max_length=64),
        ),
        migrations.AddIndex(
            model_name="artifact",
            index=models.Index(fields=["sha256"], name="artifacts_artifact_sha256"),
        ),
    ]
