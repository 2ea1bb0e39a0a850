from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("artifacts", "0004_artifact_owner_split"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="artifact",
            name="owner",
            field=models.ForeignKey(
                on_delete=models.deletion.DO_NOTHING,
                related_name="artifacts",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="artifact",
            constraint=models.UniqueConstraint(
                fields=("owner", "sha256"), name="artifacts_artifact_owner_sha_uniq"
            ),
        ),
    ]
