from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from pippa_site.owners import OwnedQuerySet
from pippa_site.text import TITLE_MAX
from tasks.models import Brain, Conversation


class RoundQuerySet(OwnedQuerySet):
    owner_field = "conversation__owner"


class TurnQuerySet(OwnedQuerySet):
    owner_field = "round__conversation__owner"


class TurnArtifactQuerySet(OwnedQuerySet):
    owner_field = "turn__round__conversation__owner"


class CouncilRound(models.Model):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.DB_CASCADE, related_name="council_rounds"
    )
    number = models.PositiveIntegerField()
    topic = models.CharField(max_length=TITLE_MAX)
    created_at = models.DateTimeField(default=timezone.now)
    # What the round concluded, in a sentence or a few (``round_close``): the
    # round's last speaker or its owner writes it; the page shows it first and
    # the next rounds' participants receive it in their context. Empty while
    # there is no conclusion yet.
    outcome = models.TextField(blank=True, default="")
    concluded_at = models.DateTimeField(null=True, blank=True)
    # Who wrote it: "participant:<name>" or a person's actor ("user:dad").
    concluded_by = models.CharField(max_length=200, blank=True, default="")

    objects = RoundQuerySet.as_manager()

    class Meta:
        ordering = ["conversation", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "number"], name="council_round_conv_number_uniq"
            ),
            # A concluded round has its outcome's words; an open one has none.
            models.CheckConstraint(
                condition=(Q(concluded_at__isnull=True) & Q(outcome=""))
                | (Q(concluded_at__isnull=False) & ~Q(outcome="")),
                name="council_round_outcome_when_concluded",
            ),
        ]

    def __str__(self) -> str:
        return f"Round {self.number}: {self.topic}"

    def get_absolute_url(self) -> str:
        return reverse("council:round", args=[self.pk])

    @property
    def is_concluded(self) -> bool:
        return self.concluded_at is not None


class Participant(models.Model):
    round = models.ForeignKey(
        CouncilRound, on_delete=models.DB_CASCADE, related_name="participants"
    )
    name = models.CharField(max_length=100)
    brain = models.CharField(max_length=40, default=Brain.OTHER)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["round", "position", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["round", "name"], name="council_participant_round_name_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.brain})"


class Turn(models.Model):
    round = models.ForeignKey(
        CouncilRound, on_delete=models.DB_CASCADE, related_name="turns"
    )
    participant = models.ForeignKey(
        Participant, on_delete=models.DB_CASCADE, related_name="turns"
    )
    order = models.PositiveIntegerField()
    text = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TurnQuerySet.as_manager()

    class Meta:
        ordering = ["round", "order"]
        constraints = [
            models.UniqueConstraint(
                fields=["round", "order"], name="council_turn_round_order_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"Turn {self.order} by {self.participant_id}"


class TurnArtifactRole(models.TextChoices):
    PRODUCED = "produced", "produced"  # the turn's widget and its preview
    CITED = "cited", "cited"  # an earlier artifact the turn refers to
    # The branch context this turn's speaker received, kept as a small JSON
    # artifact so the page can show it exactly, however many turns follow.
    CONTEXT = "context", "context received"


class TurnArtifact(models.Model):
    """A turn produced an artifact (its widget, the preview), cites one, or
    received one (its branch context). Every role keeps the artifact alive."""

    Role = TurnArtifactRole

    turn = models.ForeignKey(
        Turn, on_delete=models.DB_CASCADE, related_name="artifact_links"
    )
    # NO ACTION: an artifact a live turn keeps cannot be deleted.
    artifact = models.ForeignKey(
        "artifacts.Artifact", on_delete=models.DO_NOTHING, related_name="turn_links"
    )
    role = models.CharField(max_length=16, choices=Role, default=Role.PRODUCED)

    objects = TurnArtifactQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["turn", "artifact", "role"], name="council_turnartifact_uniq"
            ),
            models.CheckConstraint(
                condition=Q(role__in=TurnArtifactRole.values),
                name="council_turnartifact_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.turn_id} {self.role} artifact {self.artifact_id}"
