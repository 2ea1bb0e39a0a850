from __future__ import annotations

from django.conf import settings
from django.db import connection, models
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property

from artifacts.models import ArtifactClass
from pippa_site.owners import OwnedQuerySet
from pippa_site.text import TITLE_MAX

ERR_EVENT_IMMUTABLE = "events are append-only: an existing event cannot be changed"
ERR_EVENT_DELETE = (
    "events are append-only: they leave only with their task's conversation"
)
ERR_CONVERSATION_DELETE = (
    "a conversation leaves only through tasks.services.conversation_delete"
    "(conversation_id=...), which removes its subtree in one locked transaction,"
    " then the artifacts nothing keeps and their blobs"
)


def choice_label(choices: type[models.TextChoices], value: str) -> str:
    """A choice's words, as Django's ``get_FOO_display`` gives them, without
    the dict of every choice it builds on each call (a task page asks once per
    step row); a value that is not a choice is given back as it is."""
    try:
        return choices(value).label
    except ValueError:
        return value


class DeleteRefused(Exception):
    """A ``delete()`` on a model whose rows leave only through a service."""


class EventImmutable(Exception):
    """An attempt to change or delete an event row."""


class Brain(models.TextChoices):
    CLAUDE = "claude", "Claude"
    CODEX = "codex", "Codex"
    KIMI = "kimi", "Kimi"
    GROK = "grok", "Grok"
    GLM = "glm", "GLM"
    GEMINI = "gemini", "Gemini"
    OLLAMA = "ollama", "Ollama"
    SCRIPTED = "scripted", "Scripted"
    OTHER = "other", "Other"


class ConversationQuerySet(OwnedQuerySet):
    def delete(self):
        raise DeleteRefused(ERR_CONVERSATION_DELETE)

    delete.alters_data = True
    delete.queryset_only = True


class Conversation(models.Model):
    # NO ACTION at the database: a user's conversations go through
    # conversation_delete first (see tasks.signals), never by a silent cascade.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        related_name="conversations",
    )
    title = models.CharField(max_length=TITLE_MAX)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        indexes = [
            # Conversation list: a user's conversations, newest activity first.
            models.Index(
                fields=["owner", "-updated_at"], name="tasks_conv_owner_updated"
            ),
            models.Index(fields=["-updated_at"], name="tasks_conv_updated"),
        ]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("dashboard:conversation", args=[self.pk])

    def delete(self, using=None, keep_parents=False):
        raise DeleteRefused(ERR_CONVERSATION_DELETE)

    delete.alters_data = True


# -- the dead-lease rule, once ---------------------------------------------------
# A lease is dead when any of these holds of a task's columns: nobody holds it,
# its holder has no expiry (nobody can renew it: every renewal writes one), or
# the expiry has passed. ``NOW`` stands for the moment of asking. The SQL
# (``LEASE_DEAD``), the ``Q`` (``lease_dead_q``) and one row's answer
# (``lease_dead``) are each built from this table, and
# ``tests/tasks/test_lease.py`` holds every reader of them to one table of cases.
NOW = "now"
LEASE_DEAD_WHEN = (
    ("lease_owner", "exact", ""),
    ("lease_expires_at", "isnull", True),
    ("lease_expires_at", "lt", NOW),
)
_SQL_OPERATOR = {"exact": "=", "lt": "<"}
# One row's values, as SQL reads them (NULL is less than nothing).
_PYTHON_TEST = {
    "exact": lambda value, other: value == other,
    "isnull": lambda value, flag: (value is None) is flag,
    "lt": lambda value, other: value is not None and value < other,
}


def _lease_dead_sql() -> str:
    terms = []
    for column, lookup, value in LEASE_DEAD_WHEN:
        if lookup == "isnull":
            terms.append(f"{column} IS NULL")
        else:
            bound = "%s" if value is NOW else f"'{value}'"
            terms.append(f"{column} {_SQL_OPERATOR[lookup]} {bound}")
    return f"({' OR '.join(terms)})"


# The rule in SQL, on a task's columns (one parameter: now, as Django's backend
# adapts a datetime: ``connection.ops.adapt_datetimefield_value``), for the
# hand-written statements: ``tasks.statements``, ``needs_you_sql``, the doctor.
LEASE_DEAD = _lease_dead_sql()


def lease_dead_q(prefix: str = "") -> Q:
    """The rule as a ``Q``, for a task reached as ``prefix`` (e.g. ``"task__"``)."""
    now = timezone.now()
    found = Q()
    for column, lookup, value in LEASE_DEAD_WHEN:
        found |= Q(**{f"{prefix}{column}__{lookup}": now if value is NOW else value})
    return found


def lease_dead(owner: str, expires_at, now=None) -> bool:
    """The rule for one row's ``lease_owner`` and ``lease_expires_at``."""
    values = {"lease_owner": owner, "lease_expires_at": expires_at}
    now = now or timezone.now()
    return any(
        _PYTHON_TEST[lookup](values[column], now if value is NOW else value)
        for column, lookup, value in LEASE_DEAD_WHEN
    )


class TaskQuerySet(OwnedQuerySet):
    owner_field = "conversation__owner"

    def lease_dead(self) -> TaskQuerySet:
        """Tasks no worker holds live: no holder, no expiry, or past it
        (``LEASE_DEAD_WHEN``; ``tasks.lease`` explains it)."""
        return self.filter(lease_dead_q())

    def lease_stale(self) -> TaskQuerySet:
        """Tasks whose lease has a holder but is dead: the worker is gone."""
        return self.lease_dead().exclude(lease_owner="")

    def runnable(self) -> TaskQuerySet:
        """Tasks a worker may step now: queued, or running with a dead lease,
        and not waiting out the back-off before a step's next attempt."""
        waiting = Step.objects.filter(
            task=models.OuterRef("pk"),
            status=Step.Status.PENDING,
            next_attempt_at__gt=timezone.now(),
        )
        return (
            self.filter(status__in=[Task.Status.QUEUED, Task.Status.RUNNING])
            .lease_dead()
            .exclude(models.Exists(waiting))
        )


class TaskStatus(models.TextChoices):
    QUEUED = "queued", "queued"  # waiting for a worker
    RUNNING = "running", "running"  # a worker holds (or held) the lease
    PAUSED = "paused", "paused"  # not queued; resume puts it back
    DONE = "done", "done"
    FAILED = "failed", "failed"
    NEEDS_REVIEW = "needs_review", "needs review"
    # Stopped for good by a person; a branch can still continue from it.
    CANCELLED = "cancelled", "cancelled"


# Tasks a worker may still move or a person may still decide on.
TASK_OPEN = ("queued", "running", "paused", "failed", "needs_review")
# Open tasks no worker picks up by itself: a person resumes or decides.
TASK_STOPPED = (TaskStatus.PAUSED, TaskStatus.FAILED, TaskStatus.NEEDS_REVIEW)


class Task(models.Model):
    Status = TaskStatus

    conversation = models.ForeignKey(
        Conversation, on_delete=models.DB_CASCADE, related_name="tasks"
    )
    title = models.CharField(max_length=TITLE_MAX)
    status = models.CharField(max_length=16, choices=Status, default=Status.QUEUED)
    brain = models.CharField(max_length=40, default=Brain.SCRIPTED)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Last event sequence number handed out; bumped in the same transaction as
    # each event insert, so sequences stay gap-free under concurrent writers.
    last_seq = models.PositiveIntegerField(default=0)
    # Denormalised progress for list pages, which never read step rows.
    steps_total = models.PositiveIntegerField(default=0)
    steps_done = models.PositiveIntegerField(default=0)
    branched_from = models.ForeignKey(
        "self",
        on_delete=models.DB_SET_NULL,
        null=True,
        blank=True,
        related_name="branches",
    )
    branched_at = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The sums of the task's brain_turn events (tasks.usage), written with each
    # event in one transaction, so that no page reads events to show them.
    brain_turns = models.PositiveIntegerField(db_default=0)
    brain_turns_counted = models.PositiveIntegerField(db_default=0)
    input_tokens = models.PositiveBigIntegerField(db_default=0)
    output_tokens = models.PositiveBigIntegerField(db_default=0)
    total_tokens = models.PositiveBigIntegerField(db_default=0)

    objects = TaskQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=TaskStatus.values),
                name="tasks_task_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(steps_done__lte=models.F("steps_total")),
                name="tasks_task_progress_bounded",
            ),
        ]
        indexes = [
            # Conversation page: its tasks in order.
            models.Index(fields=["conversation", "created_at"], name="tasks_task_conv"),
            # Worker poll: only queued/running tasks.
            models.Index(
                fields=["lease_expires_at"],
                name="tasks_task_runnable",
                condition=Q(status__in=["queued", "running"]),
            ),
            models.Index(fields=["status"], name="tasks_task_status"),
        ]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("dashboard:task", args=[self.pk])

    @cached_property
    def branch_url(self) -> str:
        """The "change course" page's address, reversed once per task object:
        an idle task's page links every done step to it."""
        return reverse("dashboard:task_branch", args=[self.pk])

    def get_status_display(self) -> str:
        return choice_label(TaskStatus, self.status)

    @property
    def is_idle(self) -> bool:
        return self.status not in (self.Status.QUEUED, self.Status.RUNNING)

    @property
    def is_open(self) -> bool:
        """Not done and not cancelled: pause, cancel and decisions still apply."""
        return self.status in TASK_OPEN

    @property
    def lease_live(self) -> bool:
        """A worker holds the lease now (``LEASE_DEAD_WHEN``'s negation)."""
        return not lease_dead(self.lease_owner, self.lease_expires_at)

    def lease_held_by_other(self, holder: str) -> bool:
        """A live lease that ``holder`` does not hold."""
        return self.lease_live and self.lease_owner != holder

    @property
    def lease_expired(self) -> bool:
        """The lease has a holder but is dead (``TaskQuerySet.lease_stale``)."""
        return bool(self.lease_owner) and not self.lease_live

    @property
    def progress_percent(self) -> int:
        if not self.steps_total:
            return 0
        return round(100 * self.steps_done / self.steps_total)


class StepQuerySet(OwnedQuerySet):
    owner_field = "task__conversation__owner"

    def finished(self) -> StepQuerySet:
        """Steps done or skipped (``StepStatus.finished``)."""
        return self.filter(status__in=StepStatus.finished())

    def not_done(self) -> StepQuerySet:
        """Steps not finished: what the executor still has to run or settle."""
        return self.exclude(status__in=StepStatus.finished())

    def needs_you(self) -> StepQuerySet:
        """Steps waiting for a person's decision: the one "needs you" rule.

        A failed or needs-review step, or a step left running (an open
        tool-call envelope) in a task no worker will pick up by itself
        (paused, or stopped) once no worker holds its lease. A cancelled
        task asks nothing of anyone.
        """
        return self.filter(needs_you_q())


def needs_you_sql() -> tuple[str, tuple]:
    """The "needs you" rule's one home: a SELECT of the ids of the steps that
    wait for a person's decision, and its one parameter (now, for the lease).

    A failed or needs-review step, or a step left running (an open tool-call
    envelope) in a task no worker will pick up by itself (paused, or stopped)
    once no worker holds the task's lease: while it is live the call is still
    in flight ("Pausing"), and the worker may yet finish it. A cancelled task
    asks nothing of anyone, nor does a step a person stopped ("Stop here":
    ``Step.stopped``).

    ``needs_you_q`` wraps it for the ORM (every count, list and filter); a
    hot read may name it in a statement of its own
    (``dashboard.selectors.home.next_decision_for_user``), so the rule is written
    once and the ORM never builds it per request. It starts from the partial
    index tasks_step_attention (the few running, failed or needs-review
    steps, not a user's whole history): the statuses are written out, not
    bound, because SQLite uses a partial index only when the query's text
    implies the index's condition. It names no outer table, so it holds
    inside any query.
    """
    S, T = StepStatus, TaskStatus
    sql = (
        f"SELECT s.id FROM {Step._meta.db_table} s"
        f" JOIN {Task._meta.db_table} t ON t.id = s.task_id"
        f" WHERE s.status IN {S.sql_list(S.attention())}"
        f" AND t.status <> '{T.CANCELLED.value}' AND NOT s.stopped"
        f" AND (s.status <> '{S.RUNNING.value}'"
        f" OR (t.status IN {S.sql_list(TASK_STOPPED)} AND {LEASE_DEAD}))"
    )
    return sql, (connection.ops.adapt_datetimefield_value(timezone.now()),)


def needs_you_q() -> Q:
    """The "needs you" condition on ``Step`` (``needs_you_sql``) as a ``Q``."""
    return Q(pk__in=RawSQL(*needs_you_sql()))


class StepStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    NEEDS_REVIEW = "needs_review", "needs review"
    SKIPPED = "skipped", "skipped"

    @classmethod
    def finished(cls) -> tuple[StepStatus, ...]:
        """The statuses of a finished step: done, or skipped by a person.

        The one definition: a finished step counts in ``Task.steps_done``, is
        never run again, and a plan rewrite keeps it as it is.
        """
        return (cls.DONE, cls.SKIPPED)

    @classmethod
    def attention(cls) -> tuple[StepStatus, ...]:
        """The statuses of a step that may wait for a person (a running one
        only when its worker is gone and its call was left open): the rows of
        the partial index tasks_step_attention, a task's few, not its hundreds."""
        return (cls.RUNNING, cls.FAILED, cls.NEEDS_REVIEW)

    @staticmethod
    def sql_list(statuses) -> str:
        """Statuses written out as an SQL list: ``('done', 'skipped')``."""
        return "(" + ", ".join(f"'{s.value}'" for s in statuses) + ")"


class Step(models.Model):
    Status = StepStatus

    # No index of its own: the unique (task, position) index leads with it, and each
    # index more is pages more for every step's commit.
    task = models.ForeignKey(
        Task, on_delete=models.DB_CASCADE, related_name="steps", db_index=False
    )
    position = models.PositiveIntegerField()
    title = models.CharField(max_length=TITLE_MAX)
    status = models.CharField(max_length=16, choices=Status, default=Status.PENDING)
    tool = models.CharField(max_length=100)
    args = models.JSONField(default=dict, blank=True)
    artifact_class = models.PositiveSmallIntegerField(
        choices=ArtifactClass, default=ArtifactClass.SNAPSHOT
    )
    side_effects = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    # Part of the idempotency key; only an explicit retry bumps it.
    generation = models.PositiveIntegerField(default=0)
    # NO ACTION at the database: an artifact a step points at cannot vanish.
    output = models.ForeignKey(
        "artifacts.Artifact",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="output_of",
    )
    error = models.TextField(blank=True, default="")
    # A person chose "Stop here": the step failed by their decision, so it
    # waits for nobody (``needs_you_sql``), though its other ways forward stay
    # offered. Cleared by any later decision on it.
    stopped = models.BooleanField(default=False, db_default=False)
    # After a tool failure: no attempt before this time (the back-off).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = StepQuerySet.as_manager()

    class Meta:
        ordering = ["task", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "position"], name="tasks_step_task_position_uniq"
            ),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values),
                name="tasks_step_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(artifact_class__in=ArtifactClass.values),
                name="tasks_step_class_valid",
            ),
            # A done step has its output ref.
            models.CheckConstraint(
                condition=~Q(status="done") | Q(output__isnull=False),
                name="tasks_step_done_has_output",
            ),
        ]
        indexes = [
            # Admin filter and doctor: steps needing a person.
            models.Index(
                fields=["task"],
                name="tasks_step_needs_review",
                condition=Q(status="needs_review"),
            ),
            # Worker poll: steps waiting out a retry back-off (few at a time).
            models.Index(
                fields=["task", "next_attempt_at"],
                name="tasks_step_waiting",
                condition=Q(next_attempt_at__isnull=False),
            ),
            # "Needs you" counts on the list pages: only the few steps that
            # are failed, under review or left running.
            models.Index(
                fields=["task", "status"],
                name="tasks_step_attention",
                condition=Q(status__in=list(StepStatus.attention())),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.position}. {self.title}"

    def get_status_display(self) -> str:
        return choice_label(StepStatus, self.status)

    @property
    def class_label(self) -> str:
        return ArtifactClass(self.artifact_class).label

    @property
    def is_finished(self) -> bool:
        return self.status in StepStatus.finished()

    @property
    def duration(self):
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None

    @property
    def waiting_to_retry(self) -> bool:
        """A failed tool's back-off is still running: no attempt before next_attempt_at."""
        return (
            self.status == StepStatus.PENDING
            and self.next_attempt_at is not None
            and self.next_attempt_at > timezone.now()
        )

    def idempotency_key(self) -> str:
        return f"pippa:{self.task_id}:{self.pk}:{self.generation}"


class EventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise EventImmutable(ERR_EVENT_IMMUTABLE)

    def bulk_update(self, objs, fields, batch_size=None):
        raise EventImmutable(ERR_EVENT_IMMUTABLE)

    def delete(self):
        raise EventImmutable(ERR_EVENT_DELETE)

    update.alters_data = True
    bulk_update.alters_data = True
    delete.alters_data = True


class Event(models.Model):
    """One entry of a task's append-only log.

    Written only by ``tasks.statements.events_insert`` (through ``event_append``
    and ``events_append``, or the executor's and the lease's appends).
    """

    class Kind(models.TextChoices):
        TASK_CREATED = "task_created"
        PLAN_REWRITTEN = "plan_rewritten"
        TASK_QUEUED = "task_queued"
        TASK_FINISHED = "task_finished"
        TASK_BRANCHED = "task_branched"
        LEASE_TAKEN = "lease_taken"
        LEASE_RENEWED = "lease_renewed"
        LEASE_RELEASED = "lease_released"
        LEASE_TAKEN_OVER = "lease_taken_over"
        TOOL_CALL_STARTED = "tool_call_started"
        PAYLOAD_PERSISTED = "payload_persisted"
        # The tool returned but its output could not be saved (disk full, the
        # database gone): the executor's failure, not the tool's. The envelope
        # stays open and is decided by class.
        OUTPUT_UNSAVED = "output_unsaved"
        TOOL_RESULT_PERSISTED = "tool_result_persisted"
        TOOL_CALL_FAILED = "tool_call_failed"
        UNCERTAIN_RESOLVED = "uncertain_resolved"
        STEP_NEEDS_REVIEW = "step_needs_review"
        STEP_RETRIED = "step_retried"
        STEP_SKIPPED = "step_skipped"
        STEP_FAILED = "step_failed"
        ADMIN_ACTION = "admin_action"
        # A person resolved a failed or uncertain step (adopt/rerun/fail/skip).
        STEP_RESOLVED = "step_resolved"
        TASK_PAUSED = "task_paused"
        TASK_CANCELLED = "task_cancelled"
        BRAIN_CHANGED = "brain_changed"
        # One answer of a brain: its tool-call count and token usage (tasks.usage).
        BRAIN_TURN = "brain_turn"
        # The brain's short note to itself, saved as an artifact of the task
        # (tasks.services.task_note_write); the resume document shows the last.
        NOTE_WRITTEN = "note_written"

    # No index of its own: the unique (task, seq) index leads with it, and each
    # index more is pages more for every step's commit.
    task = models.ForeignKey(
        Task, on_delete=models.DB_CASCADE, related_name="events", db_index=False
    )
    # Served by the (step, seq) index, which leads with it.
    step = models.ForeignKey(
        Step,
        on_delete=models.DB_CASCADE,
        null=True,
        blank=True,
        related_name="events",
        db_index=False,
    )
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    # Small metadata and refs (sha, artifact id, sizes); never payload text.
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["task", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "seq"], name="tasks_event_task_seq_uniq"
            ),
            models.CheckConstraint(condition=Q(seq__gte=1), name="tasks_event_seq_pos"),
        ]
        indexes = [
            # Task page: events filtered by kind, in order.
            models.Index(fields=["task", "kind", "seq"], name="tasks_event_task_kind"),
            # Envelope lookups: a step's latest events.
            models.Index(fields=["step", "seq"], name="tasks_event_step_seq"),
            # The doctor's open-envelope scan: only the tool_call_started rows.
            models.Index(
                fields=["step", "seq"],
                name="tasks_event_calls_started",
                condition=Q(kind="tool_call_started"),
            ),
            # Deletion and the doctor: which blobs a payload_persisted names.
            models.Index(
                fields=["step", "seq"],
                name="tasks_event_payloads",
                condition=Q(kind="payload_persisted"),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise EventImmutable(ERR_EVENT_IMMUTABLE)
        super().save(*args, **kwargs)

    def delete(self, using=None, keep_parents=False):
        raise EventImmutable(ERR_EVENT_DELETE)


class LinkRole(models.TextChoices):
    PERSISTED = "persisted", "persisted"
    REFERENCED = "referenced", "referenced"


class TaskArtifactQuerySet(OwnedQuerySet):
    owner_field = "task__conversation__owner"


class TaskArtifact(models.Model):
    """Ownership link: a task (and step) persisted or points at an artifact."""

    Role = LinkRole

    # NO ACTION: an artifact with a live link cannot be deleted.
    artifact = models.ForeignKey(
        "artifacts.Artifact", on_delete=models.DO_NOTHING, related_name="task_links"
    )
    # No index of its own: the unique (task, artifact, role) index leads with it, and each
    # index more is pages more for every step's commit.
    task = models.ForeignKey(
        Task, on_delete=models.DB_CASCADE, related_name="artifact_links", db_index=False
    )
    step = models.ForeignKey(
        Step,
        on_delete=models.DB_CASCADE,
        null=True,
        blank=True,
        related_name="artifact_links",
    )
    role = models.CharField(max_length=16, choices=Role, default=Role.PERSISTED)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TaskArtifactQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "artifact", "role"],
                name="tasks_link_task_artifact_role_uniq",
            ),
            models.CheckConstraint(
                condition=Q(role__in=LinkRole.values), name="tasks_link_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} {self.role} artifact {self.artifact_id}"
