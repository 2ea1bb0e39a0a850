"""A person's notification settings and the outbox of notices.

The tables kept their names from when these models lived in the tasks app
(``tasks_notifysettings``, ``tasks_notice``) until migration 0002 renamed
them; the rows are the same.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from tasks.models import Step


class NotifySettings(models.Model):
    """A person's choice to be told when a step waits for them, and where.

    Read by ``notifications.outbox``: a notice is written only for an owner who has
    notifications on and at least one address, and checked again before it
    goes out.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.DB_CASCADE,
        related_name="notify_settings",
    )
    enabled = models.BooleanField(default=False)
    # One e-mail address or Apprise URL a line, checked with Apprise at the door.
    addresses = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(default=timezone.now)
    # When the person last pressed "Send a test message" (one at a time).
    test_sent_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return (
            f"notifications of user {self.user_id}: {'on' if self.enabled else 'off'}"
        )

    @property
    def address_list(self) -> list[str]:
        return [line.strip() for line in self.addresses.splitlines() if line.strip()]


class NoticeState(models.TextChoices):
    PENDING = "pending", "waiting to be sent"
    SENT = "sent", "sent"
    # Not sent, and never will be: the decision was taken first, or the owner
    # turned notifications off; ``note`` says which.
    DROPPED = "dropped", "dropped"


class Notice(models.Model):
    """The outbox: one row per "a step started waiting for a person".

    Written in the transaction that makes the step wait
    (``notifications.outbox.notify_step_waiting``), delivered by the worker after
    the commit (``notifications.outbox.notify_deliver``). The notices that go out together
    share ``message_id``: the id of the first of them, which names the message
    (an e-mail's Message-ID), so a repeat after a crash is the same message.
    """

    State = NoticeState

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DB_CASCADE, related_name="+"
    )
    # Goes with its step, and so with its conversation.
    step = models.ForeignKey(
        Step, on_delete=models.DB_CASCADE, related_name="notices", db_index=False
    )
    reason = models.CharField(max_length=16)  # the step's waiting status
    state = models.CharField(max_length=8, choices=State, default=State.PENDING)
    created_at = models.DateTimeField(default=timezone.now)
    # Not sent before this: the gathering delay, the owner's window, a back-off.
    due_at = models.DateTimeField(default=timezone.now)
    message_id = models.PositiveBigIntegerField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # A worker's claim while it sends (compare-and-set; a dead worker's runs out).
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    note = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=NoticeState.values),
                name="notifications_notice_state_valid",
            ),
            # A step waiting once is told once, however often a crash makes
            # the transition be written again.
            models.UniqueConstraint(
                fields=["step"],
                condition=Q(state="pending"),
                name="notifications_notice_one_pending_per_step",
            ),
        ]
        indexes = [
            # The worker's delivery poll: pending notices by due time.
            models.Index(
                fields=["due_at"],
                name="notifications_notice_due",
                condition=Q(state="pending"),
            ),
            # The owner's window: when their last message went out.
            models.Index(
                fields=["owner", "sent_at"],
                name="notifications_notice_sent",
                condition=Q(state="sent"),
            ),
            # Deletion's cascade from a step.
            models.Index(fields=["step"], name="notifications_notice_step"),
        ]

    def __str__(self) -> str:
        return f"notice {self.pk} ({self.state}) for step {self.step_id}"
