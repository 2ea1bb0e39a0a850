"""NotifySettings and Notice moved to the notifications app: gone from this
app's state only; their tables stay, and notifications.0001 adopts them."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("tasks", "0007_task_token_usage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Notice"),
                migrations.DeleteModel(name="NotifySettings"),
            ],
            database_operations=[],
        ),
    ]
