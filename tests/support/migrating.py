"""Run a migration test on a database the previous schema built."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate_back(target: tuple[str, str]):
    """Migrate back to ``target``; return the apps of the schema as it stood then."""
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    executor = MigrationExecutor(connection)
    return executor.loader.project_state(
        sorted(executor.loader.applied_migrations)
    ).apps


def migrate_forward() -> None:
    """Migrate every app to its latest migration."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
