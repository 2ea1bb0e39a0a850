"""The one rule for text that comes in: what the databases cannot store, and bidi controls.

PostgreSQL refuses NUL in text and JSON (psycopg raises ``DataError``), and no
database can store an unpaired surrogate as UTF-8; SQLite would store NUL and
the page would then write it raw. So every door refuses such text with a
clear 4xx before it reaches a database (``text_check``, ``json_check``), on
both engines alike.

Titles also lose their bidi embedding, override and isolate controls
(``title_clean``): a title must not flip the text that follows it on a page.
"""

from __future__ import annotations

import re
from typing import Any

from pippa_site.errors import Invalid

ERR_BAD_TEXT = (
    "{field} contains a character that cannot be stored "
    "(NUL or an unpaired surrogate); remove it and send again"
)
# NUL, and the surrogate range (never valid on its own in UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# LRE, RLE, PDF, LRO, RLO and LRI, RLI, FSI, PDI.
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")
MAX_JSON_DEPTH = 64


class TextError(Invalid):
    """Text that no database here can store (400 at the API)."""

    code = "unstorable_text"


def text_refused(value: str) -> bool:
    """Return whether ``value`` holds a character the databases refuse."""
    return bool(_UNSTORABLE.search(value))


def text_check(value: str, *, field: str = "text") -> str:
    """Return ``value`` unchanged, or raise ``TextError`` naming ``field``."""
    if isinstance(value, str) and text_refused(value):
        raise TextError(ERR_BAD_TEXT.format(field=field))
    return value


def json_check(value: Any, *, field: str = "value", _depth: int = 0) -> Any:
    """``text_check`` every string (keys too) inside a JSON-like value."""
    if _depth > MAX_JSON_DEPTH:
        return value
    if isinstance(value, str):
        return text_check(value, field=field)
    if isinstance(value, dict):
        for key, item in value.items():
            text_check(str(key), field=field)
            json_check(item, field=field, _depth=_depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            json_check(item, field=field, _depth=_depth + 1)
    return value


def title_clean(value: str) -> str:
    """Return a title without bidi controls and unstorable characters.

    For titles written by machines (a tool's output, a rendered preview),
    where refusing would lose a result: people's input is refused first by
    ``text_check`` at the door.
    """
    return _UNSTORABLE.sub("", _BIDI_CONTROLS.sub("", value or ""))


class CleanTitlesMixin:
    """Admin: a title edited by hand loses its bidi controls, as every other
    write of a title does (NUL is already refused by the form and the door)."""

    title_fields = ("title", "topic", "name")

    def save_model(self, request, obj, form, change):
        for name in self.title_fields:
            value = getattr(obj, name, None)
            if isinstance(value, str):
                setattr(obj, name, title_clean(value))
        super().save_model(request, obj, form, change)
