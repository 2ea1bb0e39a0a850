"""WSGI entry point, for ``manage.py runserver`` and Django's test live server.

The site is served as ASGI (``pippa_site/asgi.py``: ``make run``, ``make dev``);
under WSGI everything but MCP over HTTP works, and ``/mcp/`` answers 501 saying
so (``pippa_mcp.views``).
"""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
application = get_wsgi_application()
