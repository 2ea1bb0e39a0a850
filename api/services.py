"""API tokens: create, revoke, authenticate (the JSON API and the MCP server use them)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from api.models import ApiToken
from pippa_site.errors import Invalid
from pippa_site.text import text_check, title_clean

TOKEN_PREFIX = "pip_"
PREFIX_CHARS = 12
# A token's name, as its row stores it.
TOKEN_NAME_MAX = ApiToken._meta.get_field("name").max_length
# A bearer token longer than this is not one of ours (an API token is 47
# characters, an MCP sign-in's access and refresh tokens 48: api.oauth).
TOKEN_RAW_MAX = 200
ERR_TOKEN_NAME = f"give the token a name (up to {TOKEN_NAME_MAX} characters)"
ERR_TOKEN_REVOKED = "that token is already revoked"
ERR_TOO_MANY_TOKENS = (
    "you already have {limit} active tokens: revoke one you no longer use first"
)
ERR_TOKEN_NAME_TAKEN = (
    "you already have an active token named “{name}”: choose another name, "
    "or revoke that one first"
)
ERR_TOKEN_EXPIRY = "choose how long the token lasts: {choices}"
# How long a static token may last, in days, as the tokens page offers it
# (None: until it is revoked). The form's default is DEFAULT_TOKEN_DAYS.
TOKEN_DAYS = (7, 30, 90, 365, None)
DEFAULT_TOKEN_DAYS = 90


class TokenError(Invalid):
    pass


@dataclass(frozen=True)
class NewToken:
    token: ApiToken
    # The bearer token itself: shown once, never stored.
    raw: str


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def token_create(*, user, name: str, days: int | None = None) -> NewToken:
    """Create a token for ``user`` that lasts ``days`` (None: until revoked);
    return the row and the raw token (shown once).

    A name the databases cannot store is refused (``TextError``, a 400);
    bidi controls are dropped from it. ``days`` is one of ``TOKEN_DAYS``. A user
    holds at most ``PIPPA_TOKENS_PER_USER`` active tokens: one more is refused
    until one is revoked (so a per-token bound cannot be sidestepped by making
    tokens).
    """
    text_check(name or "", field="token name")
    name = title_clean(name or "").strip()
    if not name or len(name) > TOKEN_NAME_MAX:
        raise TokenError(ERR_TOKEN_NAME)
    if days not in TOKEN_DAYS:
        choices = ", ".join(f"{d} days" if d else "never" for d in TOKEN_DAYS)
        raise TokenError(ERR_TOKEN_EXPIRY.format(choices=choices))
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = None if days is None else timezone.now() + timedelta(days=days)
    try:
        # Its own savepoint: a refused name leaves the caller's transaction usable.
        with transaction.atomic():
            # The user's row is locked: two creations at once count in turn.
            get_user_model().objects.select_for_update().only("pk").get(pk=user.pk)
            limit = settings.PIPPA_TOKENS_PER_USER
            if ApiToken.objects.active().filter(user=user).count() >= limit:
                raise TokenError(ERR_TOO_MANY_TOKENS.format(limit=limit))
            token = ApiToken.objects.create(
                user=user,
                name=name,
                sha256=token_hash(raw),
                prefix=raw[:PREFIX_CHARS],
                expires_at=expires_at,
            )
    except IntegrityError as exc:
        # api_apitoken_active_name_uniq: a second active token of that name.
        raise TokenError(ERR_TOKEN_NAME_TAKEN.format(name=name)) from exc
    return NewToken(token=token, raw=raw)


def token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token; it stops working on the next request."""
    updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if not updated:
        raise TokenError(ERR_TOKEN_REVOKED)
    token.refresh_from_db()
    return token


def token_authenticate(*, raw: str):
    """Return the user of an active, unexpired token, or None. Records when it
    was last used (at most one write a minute per token, so reads stay reads)."""
    if not raw or len(raw) > TOKEN_RAW_MAX:
        return None
    token = (
        ApiToken.objects.usable()
        .select_related("user")
        .filter(sha256=token_hash(raw))
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    # At most one write a minute per token: reads stay reads.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        with transaction.atomic():
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user
