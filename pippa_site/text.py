"""The one rule for text that comes in: what the databases cannot store, and bidi controls.

PostgreSQL refuses NUL in text and JSON (psycopg raises ``DataError``), and no
database can store an unpaired surrogate as UTF-8; SQLite would store NUL and
the page would then write it raw. So every door refuses such text with a
clear 4xx before it reaches a database (``text_check``, ``json_check``), on
both engines alike.

JSON values are checked to any depth: past ``MAX_JSON_DEPTH`` levels of
nesting the value is refused (``TextError`` too), never passed on unchecked.

Titles and council turn text lose their bidi embedding, override and isolate
controls (``title_clean``, ``bidi_strip``): text must not flip what follows it
on a page.

A media type must be ``type/subtype`` (RFC 6838's token characters, optional
``; name=value`` parameters, no CR, LF or other control characters):
``media_type_check`` is the one rule every door applies before a media type
is stored or later sent as a header.
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
ERR_TOO_DEEP = "{field} is nested more than {depth} levels deep; send flatter JSON"
ERR_MEDIA_TYPE = (
    "{field} must be a media type such as text/plain or image/svg+xml"
    " (type/subtype, optional ; parameters), not {value!r}"
)
MAX_MEDIA_TYPE = 255
# Characters of a title (a conversation's, task's, step's or artifact's, a
# council round's topic): every model's column and every door's limit.
TITLE_MAX = 300
# RFC 6838 section 4.2 names (restricted-name), and RFC 9110 parameters
# (token = token / quoted-string), with optional spaces around ";" and no
# control characters anywhere.
_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~]|\\[\t !-~])*"'
_MEDIA_TYPE = re.compile(
    rf"{_NAME}/{_NAME}(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*"
)


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
    """``text_check`` every string (keys too) inside a JSON-like value.

    A value nested deeper than ``MAX_JSON_DEPTH`` is refused as a whole
    (``TextError``): nothing deeper goes on unchecked.
    """
    if _depth > MAX_JSON_DEPTH:
        raise TextError(ERR_TOO_DEEP.format(field=field, depth=MAX_JSON_DEPTH))
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


def media_type_check(value: str, *, field: str = "media type") -> str:
    """Return ``value`` if it is a ``type/subtype`` media type, else raise ``TextError``.

    Refuses CR, LF and every other control character, so a stored media type
    can always be sent back as a ``Content-Type`` header.
    """
    if (
        not isinstance(value, str)
        or len(value) > MAX_MEDIA_TYPE
        or not _MEDIA_TYPE.fullmatch(value)
    ):
        shown = value[:80] if isinstance(value, str) else value
        raise TextError(ERR_MEDIA_TYPE.format(field=field, value=shown))
    return value


def media_type_clean(value: str, *, default: str = "application/octet-stream") -> str:
    """Return ``value`` if it is a media type by ``media_type_check``, else ``default``.

    For media types written by machines (a tool's result), where refusing
    would lose a result: people's and agents' input is refused first by
    ``media_type_check`` at the door.
    """
    try:
        return media_type_check(value)
    except TextError:
        return default


def bidi_strip(value: str) -> str:
    """Return ``value`` without bidi embedding, override and isolate controls."""
    return _BIDI_CONTROLS.sub("", value or "")


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
