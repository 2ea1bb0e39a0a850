from __future__ import annotations

from django.apps import AppConfig


class PippaMcpConfig(AppConfig):
    """The MCP door: tools and resources over the same services as the API."""

    name = "pippa_mcp"
    verbose_name = "MCP server"
