from __future__ import annotations

from django.apps import AppConfig


class PippaSiteConfig(AppConfig):
    """The site package doubles as the small app behind the JSON API (tokens)."""

    name = "pippa_site"
    verbose_name = "API"
