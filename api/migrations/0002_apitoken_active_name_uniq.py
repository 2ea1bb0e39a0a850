"""One active API token per name and user (api_apitoken_active_name_uniq).

Active tokens that already share a name get " (2)", " (3)"... in creation
order before the constraint is added, so the migration never fails on old data.
"""

from django.db import migrations, models


def rename_duplicates(apps, schema_editor):
    ApiToken = apps.get_model("api", "ApiToken")
    taken: dict[int, set[str]] = {}
    for token in ApiToken.objects.filter(revoked_at__isnull=True).order_by(
        "created_at", "id"
    ):
        names = taken.setdefault(token.user_id, set())
        if token.name in names:
            n = 2
            while True:
                suffix = f" ({n})"
                name = token.name[: 100 - len(suffix)] + suffix
                if name not in names:
                    break
                n += 1
            token.name = name
            token.save(update_fields=["name"])
        names.add(token.name)


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(rename_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.UniqueConstraint(
                condition=models.Q(revoked_at__isnull=True),
                fields=("user", "name"),
                name="api_apitoken_active_name_uniq",
            ),
        ),
    ]
