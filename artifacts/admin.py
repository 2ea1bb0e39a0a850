"""Admin for artifacts: find damaged blobs, verify them, re-render previews.

An artifact's sha, size, class and integrity are read-only: the bytes are the
identity. Verification goes through ``artifacts.services.artifact_verify`` and
re-rendering through ``artifacts.preview.preview_render``, deletion through
``artifacts.gc.artifacts_delete_unkept``. Each action is told to the apps
that keep the artifact (``artifacts.keepers.note``: tasks log an
``admin_action`` event naming the staff user) and leaves an admin history
entry on the artifact itself.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from artifacts import keepers
from artifacts.gc import (
    ArtifactKept,
    artifact_kept_by,
    artifacts_delete_unkept,
    gc_plan,
    kept_refusals,
)
from artifacts.models import Artifact, ArtifactSource, StorageQuota
from artifacts.quota import quota_usage
from pippa_site.actors import actor_for
from pippa_site.text import CleanTitlesMixin

MSG_VERIFIED = (
    "Verified {n} artifact(s): {ok} intact, {missing} missing, {corrupt} corrupt."
)
MSG_DAMAGED = "Damaged: {items}. They are marked; the doctor can repair or remove them."
MSG_PREVIEW_OK = "Rendered the preview of artifact {id} (artifact {preview})."
MSG_PREVIEW_FAILED = "Could not render the preview of artifact {id}: {reason}"
MSG_NOT_A_WIDGET = "Artifact {id} is not a widget (SVG or HTML): it has no preview."


class SourceInline(admin.TabularInline):
    model = ArtifactSource
    fk_name = "artifact"
    verbose_name = "source (lineage)"
    verbose_name_plural = "sources (lineage: derived from)"
    fields = ["source", "position"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Artifact)
class ArtifactAdmin(CleanTitlesMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "title",
        "owner",
        "artifact_class",
        "media_type",
        "size_shown",
        "sha_prefix",
        "integrity",
        "verified_at",
        "created_at",
    ]
    list_display_links = ["id", "title"]
    list_filter = ["artifact_class", "integrity", "media_type"]
    search_fields = ["title", "^sha256", "owner__username"]
    search_help_text = "Search titles, owners, or the start of a sha256."
    ordering = ["-id"]
    list_select_related = ["owner"]
    fields = [
        "title",
        "owner",
        "sha256",
        "size",
        "media_type",
        "artifact_class",
        "integrity",
        "verified_at",
        "meta",
        "kept_by",
        "preview_shown",
        "derived_shown",
        "links",
        "created_at",
    ]
    readonly_fields = [f for f in fields if f != "title"]
    inlines = [SourceInline]
    actions = ["verify_artifacts", "rerender_previews"]
    delete_confirmation_template = "admin/artifacts/artifact/delete_confirmation.html"
    delete_selected_confirmation_template = (
        "admin/artifacts/artifact/delete_selected_confirmation.html"
    )

    def has_add_permission(self, request):
        # Artifacts are written by artifact_store (blob first, then row).
        return False

    def has_repair_permission(self, request) -> bool:
        return request.user.has_perm("artifacts.change_artifact")

    @admin.display(description="size", ordering="size")
    def size_shown(self, obj):
        return filesizeformat(obj.size)

    @admin.display(description="sha256", ordering="sha256")
    def sha_prefix(self, obj):
        return format_html("<code>{}</code>", obj.sha256[:12])

    @admin.display(description="kept by")
    def kept_by(self, obj):
        reasons = artifact_kept_by(obj)
        if not reasons:
            return "nothing alive (an orphan: the doctor may sweep it)"
        return format_html(
            "<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((r,) for r in reasons))
        )

    @admin.display(description="preview")
    def preview_shown(self, obj):
        from artifacts.preview import WIDGET_MEDIA_TYPES, preview_status

        if obj.media_type not in WIDGET_MEDIA_TYPES:
            return "— (not a widget)"
        status = preview_status(obj)
        if status.get("status") == "ok":
            return format_html(
                '<img src="{}" alt="PNG preview of artifact {}" width="320">',
                reverse("artifacts:preview", args=[obj.pk]),
                obj.pk,
            )
        if status.get("status") == "failed":
            return f"failed: {status.get('reason', '')} (the re-render action retries)"
        return "not rendered yet (use the re-render action)"

    @admin.display(description="derived artifacts")
    def derived_shown(self, obj):
        rows = obj.derived_links.select_related("artifact").order_by("artifact_id")[:50]
        if not rows:
            return "—"
        return format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            (
                (
                    reverse("admin:artifacts_artifact_change", args=[r.artifact_id]),
                    r.artifact,
                )
                for r in rows
            ),
        )

    @admin.display(description="open")
    def links(self, obj):
        return format_html(
            '<a href="{}">detail</a> · <a href="{}">source</a>',
            reverse("artifacts:detail", args=[obj.pk]),
            reverse("artifacts:source", args=[obj.pk]),
        )

    # -- actions --

    @admin.action(
        permissions=["repair"], description="Verify selected artifacts (sha check)"
    )
    def verify_artifacts(self, request, queryset):
        from artifacts.services import artifact_verify

        counts = dict.fromkeys(Artifact.Integrity.values, 0)
        damaged = []
        actor = actor_for(request)
        for artifact in queryset.order_by("pk"):
            integrity = artifact_verify(artifact=artifact)
            counts[integrity] += 1
            if integrity != Artifact.Integrity.OK:
                damaged.append(
                    f"artifact {artifact.pk} ({artifact.get_integrity_display()})"
                )
            keepers.note(
                artifact=artifact,
                actor=actor,
                action="artifact_verify",
                integrity=integrity,
            )
            self.log_change(request, artifact, f"Verified: {integrity}.")
        self.message_user(
            request,
            MSG_VERIFIED.format(
                n=sum(counts.values()),
                ok=counts["ok"],
                missing=counts["missing"],
                corrupt=counts["corrupt"],
            ),
            messages.WARNING if damaged else messages.SUCCESS,
        )
        if damaged:
            self.message_user(
                request, MSG_DAMAGED.format(items=", ".join(damaged)), messages.ERROR
            )

    @admin.action(
        permissions=["repair"], description="Re-render the preview of selected widgets"
    )
    def rerender_previews(self, request, queryset):
        from artifacts.preview import WIDGET_MEDIA_TYPES, preview_render, preview_status

        actor = actor_for(request)
        for artifact in queryset.order_by("pk"):
            if artifact.media_type not in WIDGET_MEDIA_TYPES:
                self.message_user(
                    request, MSG_NOT_A_WIDGET.format(id=artifact.pk), messages.WARNING
                )
                continue
            preview = preview_render(artifact=artifact)
            if preview is None:
                artifact.refresh_from_db(fields=["meta"])
                reason = preview_status(artifact).get("reason", "render failed")
                self.message_user(
                    request,
                    MSG_PREVIEW_FAILED.format(id=artifact.pk, reason=reason),
                    messages.ERROR,
                )
                result = {"preview": "failed", "reason": reason}
            else:
                self.message_user(
                    request,
                    MSG_PREVIEW_OK.format(id=artifact.pk, preview=preview.pk),
                    messages.SUCCESS,
                )
                result = {"preview": "ok", "preview_id": preview.pk}
            keepers.note(
                artifact=artifact, actor=actor, action="preview_render", **result
            )
            self.log_change(
                request, artifact, f"Preview re-rendered: {result['preview']}."
            )

    # -- deletion: refused while anything alive keeps the artifact --

    def get_deleted_objects(self, objs, request):
        """Plan with the GC rule (artifacts.gc.gc_plan); refuse kept artifacts.

        Sources that only the deleted artifacts kept go with them, as the
        rule says, and the page lists them.
        """
        objs = list(objs)
        plan = gc_plan(candidate_ids=[a.pk for a in objs])
        protected = kept_refusals(artifacts=objs, plan=plan)
        deleted = [
            f"Artifact {r.id}: {r.title or r.sha256[:12]} and its blob"
            for r in plan.remove
        ]
        return deleted, {"artifacts": len(plan.remove)}, set(), protected

    def delete_model(self, request, obj):
        self._delete_unkept([obj])

    def delete_queryset(self, request, queryset):
        self._delete_unkept(list(queryset))

    def _delete_unkept(self, artifacts) -> None:
        try:
            artifacts_delete_unkept(artifacts=artifacts)
        except ArtifactKept as exc:
            raise PermissionDenied(str(exc)) from None


@admin.register(StorageQuota)
class StorageQuotaAdmin(admin.ModelAdmin):
    """Each user's stored bytes (kept by the schema) and their own quota,
    which staff may set (empty: the site's PIPPA_QUOTA_BYTES; 0: no limit)."""

    list_display = ("owner", "used_shown", "limit_shown")
    search_fields = ("owner__username",)
    fields = ("owner", "used_shown", "limit_bytes")
    readonly_fields = ("owner", "used_shown")

    def has_add_permission(self, request):
        return False  # a user's row appears with their first artifact

    def has_delete_permission(self, request, obj=None):
        return False  # it leaves with its user

    @admin.display(description="stored", ordering="used_bytes")
    def used_shown(self, obj):
        return f"{filesizeformat(obj.used_bytes)} ({obj.used_bytes:,} bytes)"

    @admin.display(description="quota", ordering="limit_bytes")
    def limit_shown(self, obj):
        usage = quota_usage(owner_id=obj.owner_id)
        if not usage.limited:
            return "no limit"
        default = "" if obj.limit_bytes is not None else " (the site's default)"
        return f"{filesizeformat(usage.limit)}{default}"
