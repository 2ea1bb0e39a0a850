"""API tokens: create, revoke, authenticate (the JSON API and the MCP server use them)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from api.models import ApiToken
from pippa_site.errors import Invalid
from pippa_site.text import text_check, title_clean

TOKEN_PREFIX = "pip_"
PREFIX_CHARS = 12
ERR_TOKEN_NAME = "give the token a name (up to 100 characters)"
ERR_TOKEN_REVOKED = "that token is already revoked"


class TokenError(Invalid):
    pass


@dataclass(frozen=True)
class NewToken:
    token: ApiToken
    # The bearer token itself: shown once, never stored.
    raw: str


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def token_create(*, user, name: str) -> NewToken:
    """Create a token for ``user``; return the row and the raw token (shown once).

    A name the databases cannot store is refused (``TextError``, a 400);
    bidi controls are dropped from it.
    """
    text_check(name or "", field="token name")
    name = title_clean(name or "").strip()
    if not name or len(name) > 100:
        raise TokenError(ERR_TOKEN_NAME)
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, sha256=token_hash(raw), prefix=raw[:PREFIX_CHARS]
    )
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
    """Return the user of an active token, or None. Records when it was last used
    (at most one write a minute per token, so reads stay reads)."""
    if not raw or len(raw) > 200:
        return None
    token = (
        ApiToken.objects.active()
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
