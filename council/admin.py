"""Admin for council rounds, participants and turns.

Turns are a record of what was said and which artifacts each speaker made or
saw: read-only here. Rounds, participants and turns leave only with their
conversation (``conversation_delete``), which applies the artifact rule;
deleting one on its own would orphan the artifacts its turns keep.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count
from django.template.defaultfilters import truncatechars

from council.models import CouncilRound, Participant, Turn, TurnArtifact
from pippa_site.text import CleanTitlesMixin


class NoAddDeleteMixin:
    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ParticipantInline(NoAddDeleteMixin, admin.TabularInline):
    model = Participant
    fields = ["position", "name", "brain"]
    readonly_fields = fields
    extra = 0

    def has_change_permission(self, request, obj=None):
        return False


class TurnInline(NoAddDeleteMixin, admin.TabularInline):
    model = Turn
    fields = ["order", "participant", "text_excerpt", "created_at"]
    readonly_fields = fields
    extra = 0
    show_change_link = True

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="text")
    def text_excerpt(self, obj):
        return truncatechars(obj.text, 120)


class TurnArtifactInline(NoAddDeleteMixin, admin.TabularInline):
    model = TurnArtifact
    fields = ["role", "artifact"]
    readonly_fields = fields
    extra = 0

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(CouncilRound)
class CouncilRoundAdmin(CleanTitlesMixin, NoAddDeleteMixin, admin.ModelAdmin):
    list_display = [
        "number",
        "topic",
        "conversation",
        "participant_count",
        "turn_count",
        "created_at",
    ]
    list_display_links = ["number", "topic"]
    list_select_related = ["conversation"]
    list_filter = ["participants__brain", "created_at"]
    search_fields = ["topic", "conversation__title"]
    # The outcome is written through council.services.round_conclude (the
    # round's page, MCP): shown here, not edited.
    fields = [
        "conversation",
        "number",
        "topic",
        "created_at",
        "outcome",
        "concluded_by",
        "concluded_at",
    ]
    readonly_fields = [
        "conversation",
        "number",
        "created_at",
        "outcome",
        "concluded_by",
        "concluded_at",
    ]
    inlines = [ParticipantInline, TurnInline]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_participants=Count("participants", distinct=True),
                n_turns=Count("turns", distinct=True),
            )
        )

    @admin.display(description="participants", ordering="n_participants")
    def participant_count(self, obj):
        return obj.n_participants

    @admin.display(description="turns", ordering="n_turns")
    def turn_count(self, obj):
        return obj.n_turns


@admin.register(Participant)
class ParticipantAdmin(CleanTitlesMixin, NoAddDeleteMixin, admin.ModelAdmin):
    list_display = ["name", "brain", "round", "position"]
    list_select_related = ["round"]
    list_filter = ["brain"]
    search_fields = ["name", "round__topic"]
    fields = ["round", "position", "name", "brain"]
    readonly_fields = fields


@admin.register(Turn)
class TurnAdmin(NoAddDeleteMixin, admin.ModelAdmin):
    list_display = ["id", "round", "order", "participant", "text_excerpt", "created_at"]
    list_display_links = ["id", "order"]
    list_select_related = ["round", "participant"]
    list_filter = ["participant__brain", "created_at"]
    search_fields = ["text", "round__topic", "participant__name"]
    fields = ["round", "order", "participant", "text", "created_at"]
    readonly_fields = fields
    inlines = [TurnArtifactInline]

    @admin.display(description="text")
    def text_excerpt(self, obj):
        return truncatechars(obj.text, 80)

    def has_change_permission(self, request, obj=None):
        return False
