"""The API app took over the token model without touching any database."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from api.models import ApiToken

pytestmark = pytest.mark.django_db


def test_the_token_table_permissions_and_admin_url_keep_their_names():
    config = apps.get_app_config("pippa_site")

    assert config.name == "api"
    assert ApiToken._meta.db_table == "pippa_site_apitoken"
    assert reverse("admin:pippa_site_apitoken_changelist") == (
        "/admin/pippa_site/apitoken/"
    )
    assert ApiToken._meta.db_table in connection.introspection.table_names()


def test_a_database_migrated_before_the_move_needs_no_migration():
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())

    assert plan == []
    assert ("pippa_site", "0001_initial") in executor.loader.applied_migrations
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
