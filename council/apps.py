from __future__ import annotations

from django.apps import AppConfig


class CouncilConfig(AppConfig):
    name = "council"

    def ready(self) -> None:
        """Tell the apps below what council rows keep and hold (council.keeping)."""
        # Models, and the modules that import them, load only once apps are ready.
        from council.keeping import register_all

        register_all()
