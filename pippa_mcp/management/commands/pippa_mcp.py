"""Serve Pippa over MCP on stdio: ``manage.py pippa_mcp --user dad``.

An agent (Claude Code, Codex CLI, Gemini CLI, ...) starts this command and
talks MCP over its stdin/stdout. The user the server acts as is named by
``--user``, or by an API token (``--token``, or the environment variable
named by ``--token-env``, PIPPA_API_TOKEN by default). Nothing but protocol
messages is written to stdout; logs go to stderr.
"""

from __future__ import annotations

import os

import anyio
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from api.services import token_authenticate
from pippa_mcp.server import acting_as, serve_stdio
from tasks import crashpoints

ERR_WHO = (
    "say who the server acts as: --user NAME, --token TOKEN, or a token in the"
    " environment variable {var}"
)
ERR_NO_USER = "no active user named {name!r}"
ERR_BAD_TOKEN = "the API token is unknown, revoked, or its user is inactive"


class Command(BaseCommand):
    help = "Serve the Pippa MCP server over stdio for one user."

    def add_arguments(self, parser):
        parser.add_argument("--user", default="", help="act as this user")
        parser.add_argument("--token", default="", help="act as this API token's user")
        parser.add_argument(
            "--token-env",
            default="PIPPA_API_TOKEN",
            help="environment variable holding an API token (default PIPPA_API_TOKEN)",
        )
        crashpoints.add_option(parser)

    def handle(self, *args, **opts):
        crashpoints.arm(opts["crashpoint"])
        user = None
        if opts["user"]:
            user = (
                get_user_model()
                .objects.filter(username=opts["user"], is_active=True)
                .first()
            )
            if user is None:
                raise CommandError(ERR_NO_USER.format(name=opts["user"]))
        else:
            raw = opts["token"] or os.environ.get(opts["token_env"] or "", "")
            if not raw:
                raise CommandError(ERR_WHO.format(var=opts["token_env"]))
            user = token_authenticate(raw=raw)
            if user is None:
                raise CommandError(ERR_BAD_TOKEN)
        # The tools open their own connections in worker threads.
        connections.close_all()
        with acting_as(user):
            anyio.run(serve_stdio)
