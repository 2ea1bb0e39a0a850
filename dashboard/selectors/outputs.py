"""What the task page shows of a step's output: previews, excerpts, headlines."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from django.conf import settings
from django.urls import get_script_prefix, get_urlconf, reverse

from artifacts.models import Artifact
from artifacts.selectors import search_headlines
from artifacts.store import BlobError, default_store

EXCERPT_BYTES = 800

TEXT_TYPES = (
    "application/json",
    "application/xml",
    "application/x-ndjson",
    "application/csv",
)
RASTER_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
RENDER_TYPES = ("image/svg+xml", "text/html")


@dataclass
class SavedOutput:
    """The output a step's interrupted call saved but never recorded."""

    sha: str
    size: int
    media_type: str
    title: str
    # "image" (raster), "svg" (drawn in an <img>, where no script runs),
    # "headlines" (a saved search), "excerpt", "" (shown only as a download)
    preview: str = ""
    excerpt: str = ""
    excerpt_truncated: bool = False
    headlines: list[dict] = field(default_factory=list)


# An artifact id no row has: reversed once, it splits each route in two.
_ANY_ARTIFACT = 987654321987


@cache
def _artifact_routes(
    prefix: str, urlconf: str | None, root: str
) -> dict[str, tuple[str, str]]:
    """Each artifact page's URL before and after its id, for one script
    ``prefix`` and URLconf (``urlconf``, else ``root``)."""
    parts = {}
    for name in ("detail", "source", "preview"):
        url = reverse(f"artifacts:{name}", args=[_ANY_ARTIFACT], urlconf=urlconf)
        head, _, tail = url.partition(str(_ANY_ARTIFACT))
        parts[name] = (head, tail)
    return parts


def artifact_routes() -> dict[str, tuple[str, str]]:
    """The artifact pages' routes for this request's script prefix and URLconf.

    Read once per list of rows: each read of the prefix and the URLconf is an
    ``asgiref`` ``Local`` behind one lock that every server thread shares.
    """
    return _artifact_routes(get_script_prefix(), get_urlconf(), settings.ROOT_URLCONF)


def artifact_url(name: str, artifact_id: int, routes=None) -> str:
    """``{% url 'artifacts:<name>' artifact_id %}`` without reversing a route
    per row: the route's two halves are reversed once per script prefix."""
    head, tail = (routes or artifact_routes())[name]
    return f"{head}{artifact_id}{tail}"


def preview_kind(artifact: Artifact) -> str:
    return _media_kind(artifact.media_type)


def _media_kind(media_type: str) -> str:
    media = media_type.split(";")[0].strip().lower()
    if media in RASTER_TYPES:
        return "image"
    if media in RENDER_TYPES:
        return "render"
    if media.startswith("text/") or media in TEXT_TYPES or media.endswith("+json"):
        return "excerpt"
    return "binary"


class OutputHeads:
    """The first bytes of a list of rows' text outputs, read from the store
    all at once when the first of those rows is drawn: a page whose rows are
    all kept (``StepRow.fragment_key``) reads nothing from the store."""

    def __init__(self, shas: list[str]) -> None:
        self._shas = shas
        self._read: dict[str, bytes] | None = None

    def get(self, sha: str) -> bytes | None:
        if self._read is None:
            self._read = default_store().heads(self._shas, EXCERPT_BYTES + 1)
        return self._read.get(sha)


def output_excerpt(
    artifact: Artifact, heads: OutputHeads | None = None
) -> tuple[str, bool, bool]:
    """Return (text, truncated, missing) for the head of a text artifact
    (from ``heads``, a page's heads read at once, when given)."""
    if heads is not None:
        head = heads.get(artifact.sha256)
        return _excerpt_of(head) if head is not None else ("", False, True)
    return _blob_excerpt(artifact.sha256)


def _blob_excerpt(sha: str) -> tuple[str, bool, bool]:
    """Return (text, truncated, missing) for the head of a text blob."""
    try:
        head = default_store().head(sha, EXCERPT_BYTES + 1)
    except (BlobError, OSError):
        return "", False, True
    return _excerpt_of(head)


def _excerpt_of(head: bytes) -> tuple[str, bool, bool]:
    truncated = len(head) > EXCERPT_BYTES
    return head[:EXCERPT_BYTES].decode("utf-8", errors="replace"), truncated, False


def saved_output(payload: dict | None) -> SavedOutput | None:
    """Describe an envelope's saved payload for the "use it" choice (no artifact row yet)."""
    if not payload or not payload.get("sha"):
        return None
    media = str(payload.get("media_type") or "application/octet-stream")
    saved = SavedOutput(
        sha=payload["sha"],
        size=int(payload.get("size") or 0),
        media_type=media,
        title=str(payload.get("title") or ""),
    )
    kind = _media_kind(media)
    if kind == "image":
        saved.preview = "image"
    elif media.split(";")[0].strip().lower() == "image/svg+xml":
        saved.preview = "svg"
    elif kind == "excerpt":
        text, saved.excerpt_truncated, missing = _blob_excerpt(saved.sha)
        if not missing:
            saved.preview, saved.excerpt = "excerpt", text
            saved.headlines = search_headlines(sha256=saved.sha, media_type=media)
            if saved.headlines:
                saved.preview = "headlines"
    return saved
