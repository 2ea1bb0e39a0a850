from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Dad's pages: conversations, tasks, their timelines and decisions (no models).

    A door above tasks and council: it reads both and writes only through
    their services (``tasks.actions``, ``tasks.services``).
    """

    name = "dashboard"
    verbose_name = "Dashboard"
