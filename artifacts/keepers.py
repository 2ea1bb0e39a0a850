"""Who keeps an artifact alive: a registry each app fills when it is ready.

The artifacts app knows nothing of the tables above it. An app whose rows
keep an artifact (a task's link, a step's output, a council turn's link)
registers a ``Keeper`` here from its ``AppConfig.ready()``. The artifact rule
(``artifacts.gc``: what a delete keeps and why, what the doctor sweeps), the
owner listing on an artifact's page, a conversation's delete and the admin's
"kept by" all read the registry, so a new kind of keeper is one registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import Exists, OuterRef


@dataclass(frozen=True)
class OwnerLink:
    """A task or a council turn that keeps an artifact, as its page lists it."""

    kind: str  # "task" or "turn"
    role: str
    obj: object  # a Task or a Turn


@dataclass(frozen=True)
class Keeper:
    """Rows of ``model`` keep the artifact their ``artifact`` field names.

    - ``parent``: the row's owner one step up (a task, a turn), named ``noun``
      in words; ``conversation``: the lookup from a row to its conversation
      (``"task__conversation"``). A row keeps its artifact only while that
      chain is alive.
    - ``shared(parent_ids)``: why a keeper in another conversation keeps an
      artifact, for each parent (a delete's preview; a parent already gone is
      said to be gone).
    - ``kept_by(artifact)``: a person's lines for the admin's "kept by".
    - ``owners(artifact, user, staff)``: the tasks or turns the artifact's
      page lists, as ``user`` sees them (``pippa_site.owners``; ``None`` when
      another keeper of the same app lists them).
    """

    name: str
    model: type[models.Model]
    artifact: str
    parent: str
    conversation: str
    noun: str
    shared: Callable[[list[int]], dict[int, str]]
    kept_by: Callable[[Any], list[str]]
    owners: Callable[[Any, Any, bool], list[OwnerLink]] | None = None

    @property
    def artifact_id(self) -> str:
        return f"{self.artifact}_id"

    @property
    def parent_id(self) -> str:
        return f"{self.parent}_id"

    @property
    def conversation_id(self) -> str:
        return f"{self.conversation}_id"

    def rows(self) -> models.QuerySet:
        """Rows that name an artifact, unordered (they go into unions)."""
        return self.model._default_manager.filter(
            **{f"{self.artifact}__isnull": False}
        ).order_by()

    def alive(self) -> models.QuerySet:
        """Rows whose chain up to their conversation is intact."""
        conversation_model = _follow(self.model, self.conversation)
        return self.rows().filter(
            Exists(
                conversation_model._default_manager.filter(
                    pk=OuterRef(self.conversation_id)
                )
            )
        )


def _follow(model: type[models.Model], path: str) -> type[models.Model]:
    """The model at the end of a ``a__b`` lookup path (without importing it)."""
    for name in path.split("__"):
        model = model._meta.get_field(name).related_model
    return model


_registry: dict[str, Keeper] = {}
_notes: list[Callable[..., None]] = []


def register(keeper: Keeper) -> None:
    """Add a keeper (registering the same name again replaces it)."""
    _registry[keeper.name] = keeper


def keepers() -> tuple[Keeper, ...]:
    """Every registered keeper, in registration order (the first one found
    gives a kept artifact its reason)."""
    return tuple(_registry.values())


def note_register(note: Callable[..., None]) -> None:
    """Add a listener for ``note``: an app that logs what people do to an
    artifact its rows keep (tasks: an event on each keeping task)."""
    if note not in _notes:
        _notes.append(note)


def note(*, artifact, actor: str, action: str, **data) -> None:
    """Tell every app that keeps ``artifact`` what a person did to it."""
    for listener in _notes:
        listener(artifact=artifact, actor=actor, action=action, **data)


def conversation_artifact_ids(*, conversation_id: int) -> set[int]:
    """The artifacts that one conversation's rows keep (a delete's candidates)."""
    found: set[int] = set()
    for keeper in keepers():
        found.update(
            keeper.rows()
            .filter(**{keeper.conversation_id: conversation_id})
            .values_list(keeper.artifact_id, flat=True)
            .distinct()
        )
    return found


def kept_by(artifact) -> list[str]:
    """Every registered keeper's lines for this artifact, in registry order."""
    return [line for keeper in keepers() for line in keeper.kept_by(artifact)]


def owners(*, artifact, user, staff: bool = False) -> list[OwnerLink]:
    """The tasks and council turns that keep ``artifact``, as ``user`` sees them
    (every one to staff with ``staff``)."""
    return [
        link
        for keeper in keepers()
        if keeper.owners is not None
        for link in keeper.owners(artifact, user, staff)
    ]
