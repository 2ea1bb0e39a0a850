from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The JSON API for brains outside the process, and its tokens.

    The label stays ``pippa_site``, where the token model was born: its table,
    migrations, permissions and admin URLs keep their names, so moving the
    code here changed nothing in any database.
    """

    name = "api"
    label = "pippa_site"
    verbose_name = "API"
