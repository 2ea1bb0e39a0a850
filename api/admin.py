"""API tokens and MCP sign-ins in the admin: look up and revoke; never create
(a token is shown once; a sign-in is made by its person on the consent page)."""

from __future__ import annotations

from django.contrib import admin, messages

from api.models import ApiToken, OAuthGrant
from api.oauth import grant_revoke
from api.services import TokenError, token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "user",
        "prefix",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = (
        "user",
        "name",
        "sha256",
        "prefix",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        # Tokens are made on /settings/tokens/ by their owner, who sees them once.
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        revoked = 0
        for token in queryset.filter(revoked_at__isnull=True):
            try:
                token_revoke(token=token)
            except TokenError:
                continue
            revoked += 1
        messages.success(request, f"Revoked {revoked} token(s).")


@admin.register(OAuthGrant)
class OAuthGrantAdmin(admin.ModelAdmin):
    list_display = (
        "client_name",
        "user",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("client_name", "user__username")
    # The client's id is its signed metadata: long, and no use to read here.
    exclude = ("client_id",)
    readonly_fields = (
        "user",
        "client_name",
        "scope",
        "resource",
        "code_id",
        "access_sha256",
        "access_expires_at",
        "refresh_sha256",
        "replaced_refresh_sha256",
        "expires_at",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    actions = ["sign_out"]

    def has_add_permission(self, request) -> bool:
        # A sign-in is made by its person, on the consent page.
        return False

    @admin.action(description="Sign the selected apps out", permissions=["change"])
    def sign_out(self, request, queryset) -> None:
        ended = sum(
            grant_revoke(grant=g) for g in queryset.filter(revoked_at__isnull=True)
        )
        messages.success(request, f"Signed out {ended} app(s).")
