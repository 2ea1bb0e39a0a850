from __future__ import annotations

from django.apps import AppConfig
from django.db.backends.signals import connection_created


class ArtifactsConfig(AppConfig):
    name = "artifacts"

    def ready(self) -> None:
        from pippa_site.private import db_files_private

        # The database holds refs and the sessions table: this account's only.
        connection_created.connect(
            db_files_private, dispatch_uid="pippa_site.private.db_files_private"
        )
