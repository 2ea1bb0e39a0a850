from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The JSON API for brains outside the process, and its tokens.

    The label was ``pippa_site`` until the token model's app took its own
    name; ``migrations/0001_initial.py`` adopts a table made under the old
    label with its rows, permissions and admin history.
    """

    name = "api"
    label = "api"
    verbose_name = "API"
