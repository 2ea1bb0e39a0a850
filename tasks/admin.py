"""Admin for manual repair: conversations, tasks, steps, events, ownership links.

State fields (statuses, leases, attempts, output refs, event rows) are
read-only in every form. Changes go through actions, and every action calls
the same service the rest of the project uses (``tasks.actions``,
``tasks.lease``, ``tasks.services``, ``tasks.doctor``), passing ``actor="staff:<username>"`` so
the event it logs names the person who did it.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from pippa_site.actors import actor_for
from pippa_site.errors import PippaError
from pippa_site.text import CleanTitlesMixin
from tasks.actions import (
    step_resolve,
    step_resolve_options,
    step_retry,
    task_branch,
    task_cancel,
    task_pause,
    task_resume,
)
from tasks.doctor import doctor_run
from tasks.lease import lease_release
from tasks.models import Conversation, Event, Step, Task, TaskArtifact, needs_you_q
from tasks.resume import resume_advice
from tasks.services import (
    conversation_delete,
    conversation_deletion_preview,
    event_append,
)
from tasks.words import CHOICES, OUTSIDE_RERUN

# User-facing messages (tests assert them).
MSG_LEASE_RELEASED = "Released the stale lease of {n} task(s)."
MSG_LEASE_NOT_STALE = "Left {n} task(s) alone: they hold no lease."
MSG_RESUMED = "Queued {n} task(s) for the worker."
MSG_PAUSED = "Paused {n} task(s): each stops after the step it is on."
MSG_CANCELLED = "Cancelled {n} task(s): each stops after the step it is on."
MSG_RETRIED = "Step {step} will run again."
MSG_RESOLVED = "Step {step}: {words}"
MSG_BRANCHED = "Made task {new} from task {old}, keeping steps 1–{k}."
MSG_REFUSED = "{what}: {error}"
MSG_ONE_AT_A_TIME = "Choose exactly one {what} for this action."
MSG_NOT_OFFERED = "That action is not offered for this step now."
MSG_NO_OPTIONS = (
    "Step {step} has nothing to resolve: it is not in the uncertain state "
    "and does not need review."
)
MSG_DOCTOR_REPAIRED = (
    "The doctor repaired {repaired} problem(s); {remaining} remain for a person."
)
MSG_CONVERSATIONS_DELETED = "Deleted {n} conversation(s): {removed} row(s) removed."

# The choices on a step, named as the dashboard names them (tasks.words is the
# one place for Dad's words): {action: (name, what happens)}.
RESOLVE_LABELS = {action: name for action, (name, _) in CHOICES.items()}
RESOLVE_WORDS = {action: words for action, (_, words) in CHOICES.items()}
RERUN_OUTSIDE_EFFECTS = " " + OUTSIDE_RERUN


admin.site.site_header = "Pippa Stateful admin"
admin.site.site_title = "Pippa Stateful admin"
admin.site.index_title = "Repair"


def _error_text(exc: Exception) -> str:
    return str(exc.args[0]) if exc.args else str(exc)


class RepairPermissionMixin:
    """Actions that change state need the model's change permission.

    They also report alike: a refusal names the row and the service's words,
    an action for one row refuses any other selection, and a confirmation
    page is the admin's own page with the selection carried along.
    """

    def has_repair_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def message_refused(self, request: HttpRequest, *, what: str, exc: Exception):
        self.message_user(
            request,
            MSG_REFUSED.format(what=what, error=_error_text(exc)),
            messages.ERROR,
        )

    def redirect_to_one(
        self, request: HttpRequest, queryset, *, what: str, url_name: str
    ) -> HttpResponseRedirect | None:
        """Go to ``url_name`` for the one selected row; refuse any other selection."""
        rows = list(queryset[:2])
        if len(rows) != 1:
            self.message_user(
                request, MSG_ONE_AT_A_TIME.format(what=what), messages.ERROR
            )
            return None
        return HttpResponseRedirect(reverse(url_name, args=[rows[0].pk]))

    def confirmation(
        self, request: HttpRequest, template: str, *, title: str, **context
    ) -> TemplateResponse:
        """The page that asks before a bulk action; it posts the action again."""
        return TemplateResponse(
            request,
            template,
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": title,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                **context,
            },
        )


class StepShownMixin:
    """How a step's attempts and repair link read, in the step list and inline."""

    @admin.display(description="attempts")
    def attempts_shown(self, obj):
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="repair")
    def repair_link(self, obj):
        # A cheap guess for list pages; the page itself asks step_resolve_options.
        if obj.status not in (
            Step.Status.NEEDS_REVIEW,
            Step.Status.RUNNING,
            Step.Status.FAILED,
        ):
            return "—"
        url = reverse("admin:tasks_step_resolve", args=[obj.pk])
        return format_html('<a href="{}">Decide…</a>', url)


# -- filters ------------------------------------------------------------------


class LeaseExpiredFilter(admin.SimpleListFilter):
    title = "lease expired"
    parameter_name = "lease_expired"

    def lookups(self, request, model_admin):
        return [
            ("yes", "Yes (stale: held, past expiry)"),
            ("no", "No (live, or no lease)"),
        ]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.lease_stale()
        if self.value() == "no":
            return queryset.exclude(pk__in=Task.objects.lease_stale().values("pk"))
        return queryset


class NeedsReviewFilter(admin.SimpleListFilter):
    title = "needs review"
    parameter_name = "needs_review"

    def lookups(self, request, model_admin):
        return [
            ("yes", "Yes"),
            ("stuck", "Stuck running (task lease stale or gone)"),
            ("you", "Needs you (waiting for a person's decision)"),
            ("no", "No"),
        ]

    def queryset(self, request, queryset):
        if self.value() == "you":
            # The dashboard's "needs you" rule, word for word.
            return queryset.filter(needs_you_q())
        if self.value() == "yes":
            return queryset.filter(status=Step.Status.NEEDS_REVIEW)
        if self.value() == "stuck":
            return queryset.filter(
                status=Step.Status.RUNNING,
                task__in=Task.objects.lease_dead().values("pk"),
            )
        if self.value() == "no":
            return queryset.exclude(status=Step.Status.NEEDS_REVIEW)
        return queryset


# -- conversations --------------------------------------------------------------


@admin.register(Conversation)
class ConversationAdmin(CleanTitlesMixin, admin.ModelAdmin):
    list_display = ["title", "owner", "task_count", "round_count", "updated_at"]
    list_select_related = ["owner"]
    list_filter = ["owner"]
    search_fields = ["title", "owner__username"]
    readonly_fields = ["owner", "created_at", "updated_at", "task_links"]
    fields = ["title", "owner", "created_at", "updated_at", "task_links"]
    actions = ["delete_selected"]
    delete_confirmation_template = "admin/tasks/conversation/delete_confirmation.html"

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_tasks=Count("tasks", distinct=True),
                n_rounds=Count("council_rounds", distinct=True),
            )
        )

    def has_add_permission(self, request):
        # A conversation is created by its owner on the dashboard.
        return False

    @admin.display(description="tasks", ordering="n_tasks")
    def task_count(self, obj):
        return obj.n_tasks

    @admin.display(description="council rounds", ordering="n_rounds")
    def round_count(self, obj):
        return obj.n_rounds

    @admin.display(description="tasks")
    def task_links(self, obj):
        url = reverse("admin:tasks_task_changelist")
        return format_html(
            '<a href="{}?conversation__id__exact={}">{} task(s)</a>',
            url,
            obj.pk,
            obj.tasks.count(),
        )

    # Deletion: only through conversation_delete, confirmed against its preview.

    def _previews(self, objs) -> list[tuple[Conversation, object]]:
        return [(c, conversation_deletion_preview(conversation=c)) for c in objs]

    @staticmethod
    def _summary(previews) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _conv, report in previews:
            for label, n in report.removed_counts().items():
                counts[label] = counts.get(label, 0) + n
        return counts

    def get_deleted_objects(self, objs, request):
        previews = self._previews(objs)
        deleted = [
            f"Conversation: {conv.title} ({report.total_removed} rows)"
            for conv, report in previews
        ]
        return deleted, self._summary(previews), set(), []

    def delete_view(self, request, object_id, extra_context=None):
        obj = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if obj is not None and request.method != "POST":
            previews = self._previews([obj])
            context["previews"] = previews
        return super().delete_view(request, object_id, context)

    def delete_model(self, request, obj):
        conversation_delete(conversation_id=obj.pk)

    def delete_queryset(self, request, queryset):
        for pk in list(queryset.values_list("pk", flat=True)):
            conversation_delete(conversation_id=pk)

    @admin.action(permissions=["delete"], description="Delete selected conversations…")
    def delete_selected(self, request, queryset):
        conversations = list(queryset.order_by("pk"))
        if request.POST.get("post") == "yes":
            self.log_deletions(request, conversations)
            removed = 0
            for conv in conversations:
                removed += conversation_delete(conversation_id=conv.pk).total_removed
            self.message_user(
                request,
                MSG_CONVERSATIONS_DELETED.format(n=len(conversations), removed=removed),
                messages.SUCCESS,
            )
            return None
        previews = self._previews(conversations)
        context = {
            **self.admin_site.each_context(request),
            "title": "Delete conversations",
            "opts": self.opts,
            "queryset": conversations,
            "previews": previews,
            "model_count": self._summary(previews).items(),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            "admin/tasks/conversation/delete_selected_confirmation.html",
            context,
        )


# -- tasks ----------------------------------------------------------------------


class StepInline(StepShownMixin, admin.TabularInline):
    model = Step
    extra = 0
    can_delete = False
    show_change_link = True
    fields = [
        "position",
        "title",
        "tool",
        "artifact_class",
        "status",
        "attempts_shown",
        "output",
        "repair_link",
    ]
    readonly_fields = fields
    ordering = ["position"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _branch_choices(steps: list[Step]) -> list[tuple[int, str, list[Step]]]:
    """Return (k, label, kept steps) for every k a branch may keep: 0 up to the
    last step of the unbroken run of finished steps, short of the plan's last
    step (task_branch's rule)."""
    choices = [(0, "Keep no step: start the plan over", [])]
    for n, step in enumerate(steps, start=1):
        # After the last step a branch would be a copy that changes nothing.
        if n == len(steps) or not step.is_finished:
            break
        choices.append((n, f"Keep steps 1–{n}, continue from step {n + 1}", steps[:n]))
    return choices


@admin.register(Task)
class TaskAdmin(CleanTitlesMixin, RepairPermissionMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "title",
        "status",
        "lease_shown",
        "progress",
        "brain",
        "conversation",
        "updated_at",
    ]
    list_display_links = ["id", "title"]
    list_select_related = ["conversation"]
    list_filter = ["status", LeaseExpiredFilter, "brain", "created_at"]
    search_fields = ["title", "conversation__title"]
    search_help_text = "Search task and conversation titles."
    ordering = ["-updated_at"]
    inlines = [StepInline]
    fieldsets = [
        (None, {"fields": ["title", "conversation", "brain", "events_link"]}),
        (
            "State (read-only: changed only through the actions)",
            {
                "fields": [
                    "status",
                    "progress",
                    "lease_owner",
                    "lease_expires_at",
                    "lease_state",
                    "last_seq",
                ]
            },
        ),
        (
            "History",
            {
                "fields": [
                    "branched_from",
                    "branched_at",
                    "created_at",
                    "updated_at",
                    "finished_at",
                ]
            },
        ),
    ]
    readonly_fields = [
        f for _name, opts in fieldsets for f in opts["fields"] if f != "title"
    ]
    change_form_template = "admin/tasks/task/change_form.html"
    actions = [
        "release_stale_lease",
        "resume_tasks",
        "pause_tasks",
        "cancel_tasks",
        "branch_task",
    ]
    change_list_template = "admin/tasks/task/change_list.html"

    def has_add_permission(self, request):
        # Tasks are made by tasks.plan.task_create (and branch), never by hand.
        return False

    def has_delete_permission(self, request, obj=None):
        # A task leaves only with its conversation (conversation_delete).
        return False

    @admin.display(description="progress")
    def progress(self, obj):
        return f"{obj.steps_done}/{obj.steps_total}"

    @admin.display(description="lease", ordering="lease_expires_at")
    def lease_shown(self, obj):
        if not obj.lease_owner:
            return "—"
        if obj.lease_expired:
            return format_html("<strong>stale</strong> {}", obj.lease_owner)
        return obj.lease_owner

    @admin.display(description="lease state")
    def lease_state(self, obj):
        if not obj.lease_owner:
            return "no lease"
        return "stale (expired)" if obj.lease_expired else "live"

    @admin.display(description="events")
    def events_link(self, obj):
        url = reverse("admin:tasks_event_changelist")
        return format_html(
            '<a href="{}?task__id__exact={}">{} event(s)</a>', url, obj.pk, obj.last_seq
        )

    def get_urls(self):
        return [
            path(
                "<int:task_id>/branch/",
                self.admin_site.admin_view(self.branch_view),
                name="tasks_task_branch",
            ),
            path(
                "doctor/",
                self.admin_site.admin_view(self.doctor_view),
                name="tasks_doctor",
            ),
            *super().get_urls(),
        ]

    # -- actions --

    @admin.action(
        permissions=["repair"], description="Release the stale lease of selected tasks"
    )
    def release_stale_lease(self, request, queryset):

        released, refused = 0, 0
        for task in queryset.order_by("pk"):
            try:
                ok = lease_release(task=task, actor=actor_for(request))
            except PippaError as exc:
                self.message_refused(request, what=f"Task {task.pk}", exc=exc)
                continue
            if ok:
                released += 1
                self.log_change(request, task, "Released the stale lease.")
            else:
                refused += 1
        if released:
            self.message_user(
                request, MSG_LEASE_RELEASED.format(n=released), messages.SUCCESS
            )
        if refused:
            self.message_user(
                request, MSG_LEASE_NOT_STALE.format(n=refused), messages.WARNING
            )

    @admin.action(permissions=["repair"], description="Resume selected tasks")
    def resume_tasks(self, request, queryset):

        resumed = self._each(request, queryset, task_resume, "Resumed.")
        if resumed:
            self.message_user(request, MSG_RESUMED.format(n=resumed), messages.SUCCESS)

    def _each(self, request, queryset, service, note: str) -> int:
        """Call ``service`` on each task; report refusals; return how many worked."""
        n = 0
        for task in queryset.order_by("pk"):
            try:
                service(task=task, actor=actor_for(request))
            except PippaError as exc:
                self.message_refused(request, what=f"Task {task.pk}", exc=exc)
                continue
            n += 1
            self.log_change(request, task, note)
        return n

    @admin.action(
        permissions=["repair"],
        description="Pause selected tasks after the step they are on",
    )
    def pause_tasks(self, request, queryset):
        paused = self._each(request, queryset, task_pause, "Paused.")
        if paused:
            self.message_user(request, MSG_PAUSED.format(n=paused), messages.SUCCESS)

    @admin.action(permissions=["repair"], description="Cancel selected tasks…")
    def cancel_tasks(self, request, queryset):
        """Cancel after a confirmation page that says what will happen."""
        if request.POST.get("confirm") != "yes":
            return self.confirmation(
                request,
                "admin/tasks/task/cancel_confirmation.html",
                title="Cancel these tasks?",
                tasks=list(queryset.order_by("pk")),
            )
        cancelled = self._each(request, queryset, task_cancel, "Cancelled.")
        if cancelled:
            self.message_user(
                request, MSG_CANCELLED.format(n=cancelled), messages.SUCCESS
            )
        return None

    @admin.action(
        permissions=["repair"], description="Branch the selected task from a step…"
    )
    def branch_task(self, request, queryset):
        return self.redirect_to_one(
            request, queryset, what="task", url_name="admin:tasks_task_branch"
        )

    # -- views --

    def branch_view(self, request: HttpRequest, task_id: int) -> HttpResponse:
        """Confirm, then branch a task keeping steps 1..k."""
        if not self.has_repair_permission(request):
            raise PermissionDenied
        task = get_object_or_404(Task, pk=task_id)
        steps = list(task.steps.order_by("position"))
        change_url = reverse("admin:tasks_task_change", args=[task.pk])
        if request.method == "POST":
            try:
                k = int(request.POST.get("after_position", ""))
            except ValueError:
                k = -1
            try:
                new = task_branch(task=task, after_position=k, actor=actor_for(request))
            except PippaError as exc:
                self.message_refused(request, what=f"Task {task.pk}", exc=exc)
                return HttpResponseRedirect(request.path)
            self.log_change(
                request, task, f"Branched into task {new.pk} after step {k}."
            )
            self.message_user(
                request,
                MSG_BRANCHED.format(new=new.pk, old=task.pk, k=k),
                messages.SUCCESS,
            )
            return HttpResponseRedirect(
                reverse("admin:tasks_task_change", args=[new.pk])
            )
        context = {
            **self.admin_site.each_context(request),
            "title": f"Branch task “{task.title}”",
            "opts": self.opts,
            "task": task,
            "steps": steps,
            "choices": _branch_choices(steps),
            "change_url": change_url,
        }
        return TemplateResponse(request, "admin/tasks/task/branch.html", context)

    def doctor_view(self, request: HttpRequest) -> HttpResponse:
        """Run the doctor's checks and show its report; a POST also repairs.

        The doctor logs its own events as ``actor="doctor"``; each task its
        report says it touched also gets an ``admin_action`` event naming the
        staff user who asked for the repair.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        repair = request.method == "POST"
        if repair:
            if not self.has_repair_permission(request):
                raise PermissionDenied
            report = doctor_run(repair=True)
            for task_id in report.touched_tasks:
                event_append(
                    task_id=task_id,
                    kind=Event.Kind.ADMIN_ACTION,
                    data={"action": "doctor_repair", "actor": actor_for(request)},
                )
            self.message_user(
                request,
                MSG_DOCTOR_REPAIRED.format(
                    repaired=sum(f.repaired for f in report.findings),
                    remaining=report.problems,
                ),
                messages.SUCCESS if report.clean else messages.WARNING,
            )
        else:
            report = doctor_run(repair=False)
        context = {
            **self.admin_site.each_context(request),
            "title": "Doctor",
            "opts": self.opts,
            "report": report,
            "repaired": repair,
            "can_repair": self.has_repair_permission(request),
        }
        return TemplateResponse(request, "admin/tasks/doctor.html", context)


# -- steps ----------------------------------------------------------------------


@admin.register(Step)
class StepAdmin(
    CleanTitlesMixin, RepairPermissionMixin, StepShownMixin, admin.ModelAdmin
):
    # Status and the repair link first: they are what an operator scans for.
    list_display = [
        "id",
        "step_shown",
        "status",
        "repair_link",
        "task",
        "artifact_class",
        "attempts_shown",
        "tool",
    ]
    list_display_links = ["id", "step_shown"]
    list_select_related = ["task"]
    list_filter = [
        NeedsReviewFilter,
        "status",
        "artifact_class",
        "side_effects",
        "task__brain",
    ]
    search_fields = ["title", "tool", "task__title"]
    search_help_text = "Search step titles, tool names and task titles."
    ordering = ["task", "position"]
    fields = [
        "task",
        "position",
        "title",
        "status",
        "tool",
        "args",
        "artifact_class",
        "side_effects",
        "attempts",
        "max_attempts",
        "generation",
        "output",
        "error",
        "resume_words",
        "resolve_options",
        "started_at",
        "finished_at",
        "created_at",
    ]
    readonly_fields = fields
    actions = ["resolve_step", "retry_steps"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="step", ordering="position")
    def step_shown(self, obj):
        return f"{obj.position}. {obj.title}"

    @admin.display(description="what resume will do")
    def resume_words(self, obj):
        return resume_advice(obj).words

    @admin.display(description="choices the class rules allow")
    def resolve_options(self, obj):

        options = step_resolve_options(obj)
        if not options:
            return "none (nothing to resolve)"
        url = reverse("admin:tasks_step_resolve", args=[obj.pk])
        return format_html(
            '{} — <a href="{}">Decide…</a>',
            ", ".join(RESOLVE_LABELS.get(o, o) for o in options),
            url,
        )

    def get_urls(self):
        return [
            path(
                "<int:step_id>/resolve/",
                self.admin_site.admin_view(self.resolve_view),
                name="tasks_step_resolve",
            ),
            *super().get_urls(),
        ]

    @admin.action(
        permissions=["repair"], description="Decide what to do with the selected step…"
    )
    def resolve_step(self, request, queryset):
        return self.redirect_to_one(
            request, queryset, what="step", url_name="admin:tasks_step_resolve"
        )

    @admin.action(permissions=["repair"], description="Start selected steps over")
    def retry_steps(self, request, queryset):
        """Start steps over; a step with outside effects only after a page that
        says the call goes out again (the dashboard asks the same)."""
        steps = list(queryset.select_related("task").order_by("task_id", "position"))
        outside = [step for step in steps if step.side_effects]
        if outside and request.POST.get("confirm") != "yes":
            return self.confirmation(
                request,
                "admin/tasks/step/retry_confirmation.html",
                title="Send these calls again?",
                steps=steps,
                outside=outside,
            )
        for step in steps:
            try:
                step_retry(step=step, actor=actor_for(request))
            except PippaError as exc:
                self.message_refused(request, what=f"Step {step.pk}", exc=exc)
                continue
            self.log_change(request, step, "Retried.")
            self.message_user(
                request, MSG_RETRIED.format(step=step.pk), messages.SUCCESS
            )

    def resolve_view(self, request: HttpRequest, step_id: int) -> HttpResponse:
        """Say what each allowed resolution will do; on POST, do the chosen one."""

        if not self.has_repair_permission(request):
            raise PermissionDenied
        step = get_object_or_404(Step.objects.select_related("task"), pk=step_id)
        change_url = reverse("admin:tasks_step_change", args=[step.pk])
        options = step_resolve_options(step)
        if request.method == "POST":
            action = request.POST.get("action", "")
            if action not in options:
                self.message_user(request, MSG_NOT_OFFERED, messages.ERROR)
                return HttpResponseRedirect(request.path)
            try:
                step = step_resolve(step=step, action=action, actor=actor_for(request))
            except PippaError as exc:
                self.message_refused(request, what=f"Step {step.pk}", exc=exc)
                return HttpResponseRedirect(request.path)
            self.log_change(request, step, f"Resolved: {action}.")
            self.message_user(
                request,
                MSG_RESOLVED.format(step=step.pk, words=RESOLVE_LABELS[action]),
                messages.SUCCESS,
            )
            return HttpResponseRedirect(change_url)
        if not options:
            self.message_user(
                request, MSG_NO_OPTIONS.format(step=step.pk), messages.WARNING
            )
        context = {
            **self.admin_site.each_context(request),
            "title": f"Decide what to do with step {step.position}: {step.title}",
            "opts": self.opts,
            "step": step,
            "task": step.task,
            "options": [
                (
                    o,
                    RESOLVE_LABELS.get(o, o),
                    RESOLVE_WORDS.get(o, "")
                    + (
                        RERUN_OUTSIDE_EFFECTS
                        if o == "rerun" and step.side_effects
                        else ""
                    ),
                )
                for o in options
            ],
            "advice": self.resume_words(step),
            "change_url": change_url,
        }
        return TemplateResponse(request, "admin/tasks/step/resolve.html", context)


# -- events and links -------------------------------------------------------------


class ReadOnlyAdmin(admin.ModelAdmin):
    """View-only: rows change only through services."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "task", "step", "kind", "actor", "created_at"]
    list_display_links = ["seq", "kind"]
    list_select_related = ["task", "step"]
    list_filter = ["kind", "created_at"]
    search_fields = ["kind", "task__title"]
    ordering = ["-created_at", "-id"]

    @admin.display(description="actor")
    def actor(self, obj):
        return (obj.data or {}).get("actor", "")


@admin.register(TaskArtifact)
class TaskArtifactAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "step", "artifact", "role", "created_at"]
    list_select_related = ["task", "step", "artifact"]
    list_filter = ["role"]
    search_fields = ["task__title", "artifact__title", "^artifact__sha256"]
