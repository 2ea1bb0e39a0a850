from __future__ import annotations

from django.apps import AppConfig


class BrainsConfig(AppConfig):
    """Vendor adapters and the runner that drives a task with a brain (no models)."""

    name = "brains"
    verbose_name = "Brains"
