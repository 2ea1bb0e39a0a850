"""API tokens: per-user bearer tokens for brains that run outside the process."""

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
        return self.filter(revoked_at__isnull=True)


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

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Exact(Length("sha256"), 64),
                name="pippa_site_apitoken_sha256_len",
            ),
            models.CheckConstraint(
                condition=~Q(name=""), name="pippa_site_apitoken_name_nonempty"
            ),
        ]
        indexes = [
            # Token settings page: a user's tokens, newest first.
            models.Index(fields=["user", "-created_at"], name="pippa_site_token_user"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
