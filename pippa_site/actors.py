"""How events name the person who acted: ``staff:<username>`` from the admin."""

from __future__ import annotations


def actor_for(request) -> str:
    """Return the actor string events carry for a staff user's action."""
    return f"staff:{request.user.get_username()}"
