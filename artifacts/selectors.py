"""Reads of artifacts that span apps: who may see one, its lineage, its owners.

Visibility is ``pippa_site.owners``' one rule (docs/ownership.md): every
artifact row has one owner, and a user sees the rows they own; lineage joins
only one owner's rows, so the sources and derived artifacts of a row are the
owner's too. The artifact pages that read pass ``staff_reads(request)``
(staff see every row there, as they see every conversation); the API, a
page that writes (verify) and every write that names an artifact (``source_refs``, a council citation) use the owner's rows
only. Everyone else gets a 404, never a 403, so ids of other people's
artifacts reveal nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from artifacts import keepers
from artifacts.keepers import OwnerLink
from artifacts.models import Artifact, ArtifactSource
from pippa_site.errors import NotFound
from pippa_site.owners import user_sees_row

ERR_NOT_FOUND = "No such artifact."
MAX_TREE_NODES = 200
# Media types whose bytes are text a person or a model can read as source.
TEXT_MEDIA_PREFIXES = ("text/", "image/svg+xml", "application/json", "application/xml")


def artifact_user_may_see(*, user, artifact_id: int, staff: bool = False) -> bool:
    """Return whether ``user`` may see the artifact (``pippa_site.owners``).

    ``staff=True`` lets staff see every row (the artifact pages that read);
    every write that names an artifact leaves it off.
    """
    return Artifact.objects.for_user(user, staff=staff).filter(pk=artifact_id).exists()


def artifact_get_for_user(*, user, artifact_id: int, staff: bool = False) -> Artifact:
    """Return the artifact if ``user`` may see it; raise NotFound otherwise."""
    # The owner check is on the row itself (staff may be let through).
    if not getattr(user, "is_authenticated", False):
        raise NotFound(ERR_NOT_FOUND)
    artifact = Artifact.objects.filter(pk=artifact_id).first()
    if artifact is None or not user_sees_row(user, artifact.owner_id, staff=staff):
        raise NotFound(ERR_NOT_FOUND)
    return artifact


@dataclass
class LineageNode:
    artifact: Artifact
    children: list[LineageNode] = field(default_factory=list)
    truncated: bool = False


def _tree(
    *, root: Artifact, up: bool, user, budget: list[int], depth: int = 0
) -> list[LineageNode]:
    """Sources (``up``) or derived artifacts of ``root``, nested, bounded."""
    if depth >= 6:
        return []
    # Lineage joins one owner's rows; the filter only keeps it so.
    if up:
        links = ArtifactSource.objects.filter(
            artifact=root, source__owner_id=root.owner_id
        ).select_related("source")
        related = [link.source for link in links]
    else:
        links = ArtifactSource.objects.filter(
            source=root, artifact__owner_id=root.owner_id
        ).select_related("artifact")
        related = [link.artifact for link in links]
    nodes = []
    for item in related:
        if budget[0] <= 0:
            nodes.append(LineageNode(item, truncated=True))
            break
        budget[0] -= 1
        children = _tree(root=item, up=up, user=user, budget=budget, depth=depth + 1)
        nodes.append(LineageNode(item, children))
    return nodes


def artifact_lineage(*, artifact: Artifact, user) -> dict[str, list[LineageNode]]:
    """Return ``{"sources": [...], "derived": [...]}`` as nested node lists."""
    return {
        "sources": _tree(root=artifact, up=True, user=user, budget=[MAX_TREE_NODES]),
        "derived": _tree(root=artifact, up=False, user=user, budget=[MAX_TREE_NODES]),
    }


def artifact_owners(
    *, artifact: Artifact, user, staff: bool = False
) -> list[OwnerLink]:
    """Tasks and council turns that keep ``artifact``, limited to what ``user`` sees
    (every one to staff with ``staff``; each keeping app lists its own,
    ``artifacts.keepers``)."""
    return keepers.owners(artifact=artifact, user=user, staff=staff)


def artifact_home(
    *, artifact: Artifact, user, owners: list[OwnerLink] | None = None
) -> object | None:
    """The task or council turn whose trail the artifact's breadcrumbs follow.

    The first of its owners that ``user`` sees (pass ``owners`` when already
    read); None when it is seen only through its lineage.
    """
    if owners is None:
        owners = artifact_owners(artifact=artifact, user=user)
    return owners[0].obj if owners else None


@dataclass(frozen=True)
class TextHead:
    text: str
    truncated: bool
    is_text: bool
    missing: bool


def artifact_text_head(*, artifact: Artifact, limit: int) -> TextHead:
    """Read the first ``limit`` bytes of a text artifact as text (read-only).

    Binary artifacts are not read (``is_text`` False); a lost blob gives
    ``missing``. Invalid UTF-8 is replaced, never raised.
    """
    from artifacts.store import BlobError, default_store

    if not artifact.media_type.startswith(TEXT_MEDIA_PREFIXES):
        return TextHead("", False, False, False)
    try:
        raw = default_store().head(artifact.sha256, limit + 1)
    except (BlobError, OSError):
        return TextHead("", False, True, True)
    return TextHead(
        raw[:limit].decode("utf-8", "replace"), len(raw) > limit, True, False
    )


MAX_HEADLINES = 10
HEADLINES_READ_BYTES = 256 * 1024


def search_headlines(*, sha256: str, media_type: str) -> list[dict]:
    """A saved search's results as {title, url}, when the payload is one.

    A JSON object with a ``results`` list of objects that have a ``title``
    (the shape of a search tool's answer); anything else gives []. The task
    page's output and decision card and the artifact page draw these as
    sentences instead of the JSON.
    """
    from artifacts.store import BlobError, default_store

    if "json" not in media_type:
        return []
    try:
        data = json.loads(default_store().head(sha256, HEADLINES_READ_BYTES))
    except (BlobError, OSError, ValueError):
        return []
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        return []
    return [
        {"title": str(r["title"])[:200], "url": str(r.get("url") or "")[:500]}
        for r in results[:MAX_HEADLINES]
        if isinstance(r, dict) and r.get("title")
    ]
