"""Pippa's Model Context Protocol server (named so it never shadows the ``mcp`` SDK)."""
