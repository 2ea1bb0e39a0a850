"""Who may see a row: its owner, and staff only where a page opts in.

Every row belongs to one user (docs/ownership.md): a conversation, an artifact
and an API token directly, and what hangs below a conversation (its tasks,
steps, links, council rounds and turns) through the conversation's owner. The
rule, written once here:

- a user sees the rows they own;
- staff see every row only where a door opts in, and it decides that once
  per request with ``staff_reads(request)``: the pages that read (the
  dashboard's, the artifacts' and the council's, on GET or HEAD) pass it as
  ``staff=``; a page that writes (pause, cancel, branch, a decision, a
  delete, an upload) and its confirmation page never do, so a write acts on
  the actor's own rows, staff or not. The JSON API, the MCP server and the
  brain runner never opt in (a token acts as its own user, staff or not).
  Below the doors, selectors take ``staff`` from their caller and default to
  False. The Django admin, which only staff enter, is the repair room: it
  lists every row and changes another user's (pause, cancel, release a
  lease), with Django's model permissions deciding who may change what;
- an anonymous user sees nothing.

Another user's row is reported exactly like a missing one (a 404, never a
403), so ids reveal nothing. ``OwnedQuerySet.for_user`` applies the rule to a
query (``get_for_user`` to one row by id), ``user_sees_row`` to a row already in hand (the one-statement reads of
hot pages), and ``sees_every_row`` is the staff opt-in alone, for hand-written
SQL.
"""

from __future__ import annotations

from typing import Any, Self

from django.db import models

from pippa_site.errors import NotFound


def sees_every_row(user: Any, *, staff: bool) -> bool:
    """Return whether ``user`` is staff and the caller opted in to staff views."""
    return (
        staff
        and bool(getattr(user, "is_authenticated", False))
        and bool(getattr(user, "is_staff", False))
    )


def staff_reads(request: Any) -> bool:
    """The door's one staff decision: whether this request shows its user every
    user's rows. Only for staff, and only on a request that reads (GET or
    HEAD); a page opts in by passing it as ``staff=``."""
    return request.method in ("GET", "HEAD") and sees_every_row(
        request.user, staff=True
    )


def user_sees_row(user: Any, owner_id: int | None, *, staff: bool = False) -> bool:
    """Return whether ``user`` may see a row owned by the user ``owner_id``."""
    if not getattr(user, "is_authenticated", False):
        return False
    return owner_id == user.pk or sees_every_row(user, staff=staff)


class OwnedQuerySet(models.QuerySet):
    """A QuerySet of rows that belong to one user through ``owner_field``."""

    # The lookup from a row to its owning user, e.g. "task__conversation__owner".
    owner_field = "owner"

    def for_user(self, user: Any, *, staff: bool = False) -> Self:
        """Return the rows ``user`` may see: their own, or all to opted-in staff."""
        if not getattr(user, "is_authenticated", False):
            return self.none()
        if sees_every_row(user, staff=staff):
            return self
        return self.filter(**{self.owner_field: user.pk})

    def get_for_user(self, user: Any, pk: int, *, staff: bool = False, error: str):
        """Return row ``pk`` if ``user`` may see it; else raise NotFound(``error``),
        the same for another user's row as for a missing one."""
        found = self.for_user(user, staff=staff).filter(pk=pk).first()
        if found is None:
            raise NotFound(error)
        return found
