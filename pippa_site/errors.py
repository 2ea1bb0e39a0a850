"""Typed refusals: what a service raises when a request cannot be done.

Each kind carries its HTTP status and a machine-readable ``code``; a door
maps them by type (the JSON API's one exception handler, the MCP server's
tool errors, a view's message), never by reading the words, so rewording a
message changes nothing a program relies on. The message itself is for a
person and says what to do.

This module sits below every app: it imports nothing of the project.
"""

from __future__ import annotations

from django.http import Http404


class PippaError(Exception):
    """An anticipated refusal; its message is for the person who asked."""

    status = 400
    code = "invalid"


class Invalid(PippaError, ValueError):
    """The request itself is wrong (a bad plan, a bad value): 400."""

    status = 400
    code = "invalid"


class NotFound(PippaError, Http404, LookupError):
    """No such row, or not one the asker may see: 404.

    The one not-found error: owner getters, selectors and views raise it.
    It is Django's ``Http404`` too, so a page that lets it through is
    Django's 404 page, while the JSON API and the MCP server map it like
    every other ``PippaError``, by type."""

    status = 404
    code = "not_found"


class Conflict(PippaError):
    """The request clashes with the state it would change: 409."""

    status = 409
    code = "conflict"


class LeaseConflict(Conflict):
    """Another worker holds the task's lease right now: 409, wait and ask again."""

    code = "lease_held"


class TooMany(PippaError):
    """This user already has as many of these in flight as allowed: 429, with
    ``retry_after`` seconds for ``Retry-After``."""

    status = 429
    code = "too_many"

    def __init__(self, message: str, *, retry_after: int = 5):
        super().__init__(message)
        self.retry_after = retry_after


class Busy(TooMany):
    """The process runs as many of these as it may for everyone at once: 503."""

    status = 503
    code = "busy"
