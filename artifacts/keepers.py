"""Who keeps an artifact alive: a registry each app fills when it is ready.

The artifacts app knows nothing of the tables above it. An app whose rows
keep an artifact (a task's link, a step's output, a council turn's link)
registers them here from its ``AppConfig.ready()``; the artifact rule
(``artifacts.gc``), the doctor's sweep, a conversation's delete and the
admin's "kept by" read the registry, so a new kind of keeper is one
registration, not six edits.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models


@dataclass(frozen=True)
class Keeper:
    """Rows of ``model`` keep the artifact their ``artifact`` field names.

    ``parent`` is the row's owner one step up (a task, a turn), and
    ``conversation`` the lookup from a row to its conversation
    (``"task__conversation"``): an artifact is kept only while that chain is
    alive. ``shared`` says, for a person, why a keeper in another
    conversation keeps it (``{parent}`` is the parent's id).
    """

    name: str
    model: type[models.Model]
    artifact: str
    parent: str
    conversation: str
    shared: str

    @property
    def artifact_id(self) -> str:
        return f"{self.artifact}_id"

    @property
    def parent_id(self) -> str:
        return f"{self.parent}_id"

    @property
    def conversation_id(self) -> str:
        return f"{self.conversation}_id"


_registry: dict[str, Keeper] = {}


def register(keeper: Keeper) -> None:
    """Add a keeper (registering the same name again replaces it)."""
    _registry[keeper.name] = keeper


def keepers() -> tuple[Keeper, ...]:
    """Every registered keeper, in registration order."""
    return tuple(_registry.values())


def conversation_artifact_ids(*, conversation_id: int) -> set[int]:
    """The artifacts that one conversation's rows keep (a delete's candidates)."""
    found: set[int] = set()
    for keeper in keepers():
        found.update(
            keeper.model.objects.filter(
                **{
                    keeper.conversation_id: conversation_id,
                    f"{keeper.artifact}__isnull": False,
                }
            )
            .values_list(keeper.artifact_id, flat=True)
            .distinct()
        )
    return found
