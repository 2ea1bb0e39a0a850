from __future__ import annotations

from django.apps import AppConfig


class CouncilConfig(AppConfig):
    name = "council"
