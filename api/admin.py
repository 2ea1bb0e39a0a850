"""API tokens in the admin: look up and revoke; never create (a token is shown once)."""

from __future__ import annotations

from django.contrib import admin, messages

from api.models import ApiToken
from api.services import TokenError, token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "user",
        "prefix",
        "created_at",
        "last_used_at",
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
