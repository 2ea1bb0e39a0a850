"""The API app owns its label; a database made under the legacy label is adopted."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.urls import reverse
from django.utils import timezone

from api.models import ApiToken

LEGACY_TABLE = "pippa_site_apitoken"


@pytest.mark.django_db
def test_the_token_model_lives_under_the_api_label():
    config = apps.get_app_config("api")

    assert config.name == "api"
    assert ApiToken._meta.db_table == "api_apitoken"
    assert reverse("admin:api_apitoken_changelist") == "/admin/api/apitoken/"
    assert ApiToken._meta.db_table in connection.introspection.table_names()
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def _make_legacy_database(user_id: int) -> int:
    """Put the token table back as code before the rename left it; return a row id."""
    executor = MigrationExecutor(connection)
    executor.migrate([("api", None)])
    state = executor.loader.project_state(("api", "0001_initial"))
    model = state.apps.get_model("api", "ApiToken")
    with connection.schema_editor() as editor:
        editor.create_model(model)
        editor.alter_db_table(model, model._meta.db_table, LEGACY_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LEGACY_TABLE} (user_id, name, sha256, prefix, created_at)"
            " VALUES (%s, %s, %s, %s, %s)",
            [user_id, "laptop", "a" * 64, "pip_aaaa", timezone.now()],
        )
    MigrationRecorder(connection).record_applied("pippa_site", "0001_initial")
    ContentType.objects.filter(app_label="api").update(app_label="pippa_site")
    ContentType.objects.clear_cache()
    return ContentType.objects.get(app_label="pippa_site", model="apitoken").pk


@pytest.mark.django_db(transaction=True)
def test_a_database_migrated_under_the_legacy_label_keeps_its_tokens(
    django_user_model,
):
    user = django_user_model.objects.create_user("dad")
    ContentType.objects.get_for_model(ApiToken)  # as post_migrate left it
    legacy_type_id = _make_legacy_database(user.pk)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    token = ApiToken.objects.get()
    assert (token.user_id, token.name, token.prefix) == (user.pk, "laptop", "pip_aaaa")
    assert LEGACY_TABLE not in connection.introspection.table_names()
    ContentType.objects.clear_cache()
    assert ContentType.objects.get_for_model(ApiToken).pk == legacy_type_id
    recorder = MigrationRecorder(connection)
    assert not recorder.migration_qs.filter(app="pippa_site").exists()
    assert ("api", "0003_api_names") in recorder.applied_migrations()
    assert (
        MigrationExecutor(connection).migration_plan(executor.loader.graph.leaf_nodes())
        == []
    )
