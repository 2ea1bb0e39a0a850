"""Bearer tokens: static API tokens for scripts and runners, and the sign-ins
(OAuth grants) MCP clients make through the browser."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact
from django.utils import timezone

from pippa_site.owners import OwnedQuerySet


class ApiTokenQuerySet(OwnedQuerySet):
    owner_field = "user"

    def active(self) -> ApiTokenQuerySet:
        """Not revoked (an expired token is still active: its name stays taken
        until it is revoked, and the list says it expired)."""
        return self.filter(revoked_at__isnull=True)

    def usable(self) -> ApiTokenQuerySet:
        """Not revoked and not expired: what a request may authenticate with."""
        return self.active().filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )


class ApiToken(models.Model):
    """One bearer token. Only its sha256 is stored; the token is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="api_tokens",
    )
    name = models.CharField(max_length=100)
    # sha256 hex of the whole token; the lookup key on every API request.
    sha256 = models.CharField(max_length=64, unique=True)
    # The first characters of the token, for telling tokens apart in lists.
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Chosen by the person who made it; null: never expires.
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Exact(Length("sha256"), 64),
                name="api_apitoken_sha256_len",
            ),
            models.CheckConstraint(
                condition=~Q(name=""), name="api_apitoken_name_nonempty"
            ),
            # One active token per name and user: the list tells tokens apart
            # by name, and revoking "the laptop" must mean one token.
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=Q(revoked_at__isnull=True),
                name="api_apitoken_active_name_uniq",
            ),
        ]
        indexes = [
            # Token settings page: a user's tokens, newest first.
            models.Index(fields=["user", "-created_at"], name="api_apitoken_user"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


class OAuthGrantQuerySet(OwnedQuerySet):
    owner_field = "user"

    def active(self) -> OAuthGrantQuerySet:
        """Not revoked and not past the end the person chose."""
        return self.filter(revoked_at__isnull=True, expires_at__gt=timezone.now())


class OAuthGrant(models.Model):
    """One sign-in of an MCP client, approved by its user on the consent page.

    Made when the client exchanges the authorization code (``api.oauth``): it
    holds the sha256 of the current access token (short-lived) and refresh
    token (rotated on every refresh), never the tokens. Revoking it stops both
    at once. ``expires_at`` is when the sign-in ends, as the person chose: no
    refresh reaches past it.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="oauth_grants",
    )
    # What the client called itself when it registered (shown, never trusted).
    client_name = models.CharField(max_length=100)
    # The client's id (its signed metadata, api.oauth): a refresh or a
    # revocation must come from the client the tokens were issued to.
    client_id = models.TextField()
    scope = models.CharField(max_length=200)
    # RFC 8707: the resource the tokens are for (this site's /mcp/).
    resource = models.CharField(max_length=500)
    # The authorization code's nonce: a code exchanged twice finds its grant.
    code_id = models.CharField(max_length=32, unique=True)
    access_sha256 = models.CharField(max_length=64, unique=True)
    access_expires_at = models.DateTimeField()
    refresh_sha256 = models.CharField(max_length=64, unique=True)
    # The refresh token it replaced: presented again, it means a copy leaked.
    # Null until the first refresh (unique, so no empty string stands for none).
    replaced_refresh_sha256 = models.CharField(  # noqa: DJ001
        max_length=64, unique=True, null=True
    )
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = OAuthGrantQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["user", "-created_at"], name="api_oauthgrant_user"),
        ]

    def __str__(self) -> str:
        return f"{self.client_name} for {self.user_id}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()
