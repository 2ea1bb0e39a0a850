"""Dad's dashboard: conversations, task timelines, and the actions on them.

Views stay thin: a selector or one service, then ``render`` or a redirect
(POST-redirect-GET). htmx requests get the fragment they target
(``task_detail.html#timeline`` / ``#events``) instead of the whole page.
"""

from __future__ import annotations

import logging
from functools import cache, partial
from types import SimpleNamespace
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
)
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat, pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from artifacts.store import BlobError, default_store
from dashboard.selectors.events import (
    event_kinds,
    task_events,
    task_resume_context_json,
    task_resume_summary,
)
from dashboard.selectors.home import (
    conversation_page,
    conversation_rounds,
    conversation_tasks,
    dashboard_totals,
    next_decision_for_user,
    todo_for_user,
)
from dashboard.selectors.outputs import saved_output
from dashboard.selectors.timeline import (
    STEPS_PER_PAGE,
    current_step_page,
    step_get_for_user,
    step_in_flight,
    task_poll_state_for_user,
    task_timeline,
    task_timeline_changes,
    worker_busy_elsewhere,
)
from pippa_site.errors import NotFound, PippaError
from pippa_site.login import login_required
from pippa_site.owners import staff_reads
from pippa_site.streaming import file_streamed
from pippa_site.text import TITLE_MAX
from tasks import actions
from tasks import services as task_services
from tasks.actions import ATTENTION_STEPS
from tasks.demo import LIVE_CONVERSATION, live_task_start
from tasks.documents import conversation_get_for_user, task_get_for_user
from tasks.models import Event, Step, Task
from tasks.resume import envelope_read
from tasks.words import CHOICES, OUTSIDE_RERUN, OUTSIDE_RETRY

logger = logging.getLogger(__name__)

FRAGMENTS = ("timeline", "events")
MSG_QUEUED = "Queued “{title}” for the worker."
MSG_RETRIED = "Step {position} will run again."
MSG_RESOLVED = "Step {position}: {action}."
MSG_BRANCHED = "Branched a new task that keeps steps 1–{position}."
MSG_DELETED = "Deleted “{title}” with {summary}."
MSG_BAD_POSITION = "Choose a step to branch from."
MSG_PAUSED = "Paused “{title}”."
MSG_PAUSING = "Pausing “{title}”: step {position} finishes first, then it stops."
MSG_CANCELLED = "Cancelled “{title}”."
MSG_CANCELLING = (
    "Cancelling “{title}”: step {position} finishes first, then nothing more runs."
)
# Refusals say what happened and where things stand now (an action Dad took
# in a tab that was out of date, most often); the service's own words go to
# the log, not to him.
MSG_ALREADY_DECIDED = (
    "Step {position} was already decided, perhaps in another window: it is "
    "{status} now. Nothing was done twice."
)
MSG_NOT_A_CHOICE = (
    "Nothing was done: “{label}” is not one of the ways forward for step "
    "{position} now. The choices it has are shown below."
)
MSG_DECIDE_FIRST = (
    "Nothing was done: step {position} is {status} and waits for your "
    "decision first; choose what to do with it below."
)
MSG_TASK_MOVED_ON = (
    "Nothing was done: the task is {status} now, perhaps changed in another "
    "window. The page shows where it stands."
)
MSG_DEMO_STARTED = "Started a fresh demo task: watch it advance."
MSG_NO_LONGER_WAITS = "Step {position} no longer waits for you: it is {status} now."
MSG_BAD_SINCE = (
    "“since” is the last event number the page showed: a whole number from 0 "
    "to {last_seq} for this task."
)
# How often a task page polls while a worker may act, and while it waits
# for a person (another tab may decide).
POLL_BUSY_SECONDS = 2
POLL_IDLE_SECONDS = 10
# How often the home and conversation pages ask whether anything changed.
REFRESH_SECONDS = 10
# A live update past this many events sends the whole timeline instead of
# looking for the rows they touched.
LIVE_UPDATE_MAX_EVENTS = 1000
# DeletionReport.removed_counts() keys, in words Dad knows: (one, many).
COUNT_LABELS = {
    "conversations": ("conversation", "conversations"),
    "rounds": ("council round", "council rounds"),
    "turns": ("council turn", "council turns"),
    "tasks": ("task", "tasks"),
    "steps": ("step", "steps"),
    "events": ("log event", "log events"),
    "links": ("artifact link", "artifact links"),
    "artifacts": ("saved result", "saved results"),
}
# Counts of a deletion that only an engineer needs (shown under "Details").
ENGINEER_COUNTS = ("events", "links")
RESOLVE_LABELS = {
    "adopt": "the saved output is used; the task goes on by itself",
    "rerun": "the same call runs again; the task goes on by itself",
    "fail": "stopped by you; nothing more runs until you choose another way",
    "skip": "skipped; the task goes on by itself",
}

# The steps a branch's confirmation names one by one (the rest are "…").
BRANCH_STEPS_NAMED = 8
# The event filter of a task page names a kind, no longer than a kind is.
EVENT_KIND_MAX = Event._meta.get_field("kind").max_length


def _counted(
    report, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> list[tuple[str, int]]:
    """Return a deletion report's counts as (words, number), in report order."""
    return [
        (COUNT_LABELS.get(key, (key, key))[n != 1], n)
        for key, n in report.removed_counts().items()
        if key not in skip and (only is None or key in only)
    ]


def _actor(request: HttpRequest) -> str:
    role = "staff" if request.user.is_staff else "user"
    return f"{role}:{request.user.get_username()}"


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _unchanged(request: HttpRequest, version: str) -> bool:
    """A page's refresh (htmx, ``version`` of what it shows) with nothing new."""
    return bool(request.htmx) and request.GET.get("version") == version


@require_GET
@login_required
def conversation_list(request: HttpRequest) -> HttpResponse:
    # The page refreshes itself every REFRESH_SECONDS: a 204 while nothing of
    # the user's changed, else the to-do list and the results, out of band.
    staff = staff_reads(request)
    totals = dashboard_totals(user=request.user, staff=staff)
    if _unchanged(request, totals.version):
        return HttpResponse(status=204)
    query = request.GET.get("q", "")[:200]
    needs_you = request.GET.get("needs") == "you"
    page = conversation_page(
        user=request.user,
        staff=staff,
        query=query,
        page=request.GET.get("page"),
        needs_you=needs_you,
        totals=totals,
    )
    template = "dashboard/conversation_list.html"
    if request.htmx and request.htmx.target == "conversation-results":
        template += "#results"
    elif request.htmx and request.htmx.target == "refresh":
        template += "#refreshed"
    context = {
        "page": page,
        "query": query,
        "needs_you": needs_you,
        # Read when the template shows them (once). Search-as-you-type asks
        # for the results alone, which show neither; its rows read only the
        # totals' needs-you count, kept once a version (conversation_page).
        "totals": totals,
        "todo": cache(partial(todo_for_user, user=request.user, totals=totals)),
        "version": totals.version,
        "refresh_every": REFRESH_SECONDS,
    }
    return render(request, template, context)


@require_GET
@login_required
def conversation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    staff = staff_reads(request)
    conversation = conversation_get_for_user(
        user=request.user, conversation_id=pk, staff=staff
    )
    version = dashboard_totals(
        user=request.user, staff=staff, conversation=conversation
    ).version
    if _unchanged(request, version):
        return HttpResponse(status=204)
    tasks = conversation_tasks(conversation=conversation)
    # Staff may read another's conversation; only its owner changes it.
    mine = conversation.owner_id == request.user.pk
    context = {
        "conversation": conversation,
        "tasks": tasks,
        "rounds": conversation_rounds(conversation=conversation),
        # "Updated" follows the tasks' activity, not only the title's.
        "activity_at": max([conversation.updated_at, *(t.updated_at for t in tasks)]),
        "needs_you": sum(t.needs_you_count for t in tasks),
        "mine": mine,
        "demo_live": mine and _demo_live_offer(conversation, tasks),
        "version": version,
        "refresh_every": REFRESH_SECONDS,
    }
    template = "dashboard/conversation_detail.html"
    if request.htmx and request.htmx.target == "refresh":
        template += "#refreshed"
    return render(request, template, context)


def _demo_live_offer(conversation, tasks: list[Task]) -> bool:
    """Offer "Run the demo task" in the demo's live conversation once nothing moves."""
    if conversation.title != LIVE_CONVERSATION:
        return False
    return not any(t.status in (Task.Status.QUEUED, Task.Status.RUNNING) for t in tasks)


@require_POST
@login_required
def demo_live_run(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a fresh live demo task in the demo's live conversation."""
    conversation = conversation_get_for_user(user=request.user, conversation_id=pk)
    tasks = conversation_tasks(conversation=conversation)
    if not _demo_live_offer(conversation, tasks):
        raise NotFound("no demo task to start here")
    task = live_task_start(conversation=conversation)
    messages.success(request, MSG_DEMO_STARTED)
    return redirect(task)


@require_http_methods(["GET", "POST"])
@login_required
def conversation_delete(request: HttpRequest, pk: int) -> HttpResponse:
    conversation = conversation_get_for_user(user=request.user, conversation_id=pk)
    if request.method == "POST":
        report = task_services.conversation_delete(conversation_id=conversation.pk)
        summary = ", ".join(
            f"{n} {words}"
            for words, n in _counted(report, skip=("conversations", *ENGINEER_COUNTS))
            if n
        )
        messages.success(
            request, MSG_DELETED.format(title=conversation.title, summary=summary)
        )
        return redirect("dashboard:conversations")
    report = task_services.conversation_deletion_preview(conversation=conversation)
    counts = _counted(report, skip=ENGINEER_COUNTS)
    return render(
        request,
        "dashboard/conversation_delete.html",
        {
            "conversation": conversation,
            "report": report,
            "counts": counts,
            # The button counts what the tiles show (not the log's rows).
            "shown_total": sum(n for _, n in counts),
            "engineer_counts": _counted(report, only=ENGINEER_COUNTS),
        },
    )


def poll_seconds(task: Task) -> int | None:
    """How often a task page asks what changed: None once nothing can.

    Every 2 s while a worker may act (queued, running, or a step still in
    flight after a pause or cancel); every 10 s while it waits for a person
    (paused, a decision), whom another tab may be; never once it is done or
    cancelled with no step in flight.
    """
    if not task.is_idle or task.lease_live:
        return POLL_BUSY_SECONDS
    if task.is_open:
        return POLL_IDLE_SECONDS
    return None


def _status_context(task: Task, rows: list) -> dict:
    """What the status card says beside the task: the step in flight (found
    among the timeline's ``rows`` when it is one of them), and why a queued
    task waits."""
    return {
        "poll_every": poll_seconds(task),
        # Skipped steps count as finished but made nothing: the card says so.
        # Counted only once the task is idle (no poll every 2 s asks it).
        "skipped": Step.objects.filter(task=task, status=Step.Status.SKIPPED).count()
        if task.is_idle and task.steps_done
        else 0,
        "in_flight": step_in_flight(task=task, rows=rows),
        "worker_busy": task.status == Task.Status.QUEUED
        and not task.lease_live
        and worker_busy_elsewhere(task=task),
    }


def _task_page(request: HttpRequest, task: Task, fragment: str | None) -> HttpResponse:
    context: dict = {
        "task": task,
        "follow": "page" not in request.GET,
        "upload_limit": settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
        "title_max": TITLE_MAX,
    }
    if fragment != "events":
        step_page, rows, clock = task_timeline(task=task, page=request.GET.get("page"))
        context.update(step_page=step_page, rows=rows, clock=clock)
        context.update(_status_context(task, rows))
        # A card for each step that waits for a decision, and for each one a
        # person stopped ("Stop here": it waits for nobody, but its other
        # ways forward stay offered).
        context["cards"] = [row for row in rows if row.advice]
        context["decisions"] = [r for r in context["cards"] if not r.step.stopped]
        context["stopped"] = next(
            (r.step for r in context["cards"] if r.step.stopped), None
        )
        if task.status == Task.Status.DONE:
            # Result first: the last output the finished task made, drawn large.
            final = next((row for row in reversed(rows) if row.step.output_id), None)
            context["final"] = final
        if not context["decisions"]:
            context["next_decision"] = next_decision_for_user(
                user=request.user, after=task
            )
        if fragment is None:
            # The resume card, in words (its JSON is folded, read on demand).
            context["resume"] = task_resume_summary(task=task)
    # The event log is folded: drawn when its fold asks (the "events"
    # fragment) or when the address names a filter or an older page.
    if fragment == "events" or (
        fragment is None and ("kind" in request.GET or "before" in request.GET)
    ):
        context["events"] = task_events(
            task=task,
            kind=request.GET.get("kind", "")[:EVENT_KIND_MAX],
            before=_int_or_none(request.GET.get("before")),
        )
        context["event_kinds"] = event_kinds(task=task)
    template = "dashboard/task_detail.html" + (f"#{fragment}" if fragment else "")
    return render(request, template, context)


@require_GET
@login_required
def task_detail(request: HttpRequest, pk: int) -> HttpResponse:
    # A live poll carries the last event seq it showed: nothing new, nothing
    # to send. htmx swaps nothing on 204: scroll positions, open folds and
    # messages on the page stay as they are, and the poll costs one row.
    # The page also says whether it showed a worker on the task (``lease``): a
    # worker that stops answering writes no event, but the page must say so.
    raw_since = request.GET.get("since") if request.htmx else None
    if raw_since is not None:
        last_seq, lease_live = task_poll_state_for_user(
            user=request.user, task_id=pk, staff=staff_reads(request)
        )
        since = _int_or_none(raw_since)
        if since is None or not 0 <= since <= last_seq:
            return HttpResponseBadRequest(
                MSG_BAD_SINCE.format(last_seq=last_seq),
                content_type="text/plain; charset=utf-8",
            )
        if since == last_seq and lease_live == ("lease" in request.GET):
            return HttpResponse(status=204)
    task = task_get_for_user(user=request.user, task_id=pk, staff=staff_reads(request))
    target = request.htmx.target if request.htmx else None
    if raw_since is not None and target == "live":
        return _live_update(request, task, since)
    return _task_page(request, task, target if target in FRAGMENTS else None)


def _live_update(request: HttpRequest, task: Task, since: int) -> HttpResponse:
    """Answer the page's live poll with what changed since event ``since``.

    The page sent what it shows: ``since``, the step page (``at``; ``page``
    when Dad chose one), ``full`` when it shows decision cards, and
    ``events_kind`` when it shows the newest events. The answer is the next
    poll, then out of band the task's status, the axis, the rows of the
    steps that changed (and the running ones) and the newest events: rows
    that did not change, with their open folds and scroll, stay as they are.

    When the timeline's shape changed (the task stopped, a step needs a
    person, the current step moved to another page, or too much happened)
    the whole timeline comes instead.
    """
    page = request.GET.get("page")
    context: dict = {"task": task, "follow": page is None, "oob": True}
    if "events_kind" in request.GET:
        context["events"] = task_events(task=task, kind=request.GET["events_kind"][:40])
        context["event_kinds"] = event_kinds(task=task)
    # The page it shows now: the one Dad chose, or the current step's.
    number = current_step_page(task=task) if page is None else _int_or_none(page)
    whole = (
        task.is_idle
        or task.lease_live != ("lease" in request.GET)
        or "full" in request.GET
        or task.last_seq - since > LIVE_UPDATE_MAX_EVENTS
        or number is None
        or number != _int_or_none(request.GET.get("at"))
    )
    if not whole:
        rows, clock = task_timeline_changes(task=task, page=number, since=since)
        whole = any(row.advice for row in rows)
    if whole:
        response = _task_page(request, task, "timeline")
        if "events" in context:
            response.write(
                render_to_string("dashboard/task_detail.html#events", context, request)
            )
        return reswap(retarget(response, "#timeline"), "outerHTML")
    context.update(_status_context(task, rows))
    context.update(
        step_page=SimpleNamespace(number=number),
        rows=rows,
        clock=clock,
        decisions=[],
        cards=[],
        next_decision=next_decision_for_user(user=request.user, after=task),
    )
    return render(request, "dashboard/task_detail.html#live-update", context)


@require_GET
@login_required
def task_decide(request: HttpRequest, pk: int, position: int) -> HttpResponse:
    """Open the decision card of step ``position`` (a message's link).

    The link names the card in its path, so it survives the login page on
    the way (a ``#attention-N`` would be lost through ``?next=``); the answer
    is the task page at the card. A step that no longer waits (decided
    meanwhile) opens at its row, saying so.
    """
    task = task_get_for_user(user=request.user, task_id=pk)
    step = Step.objects.filter(task=task, position=position).first()
    if step is None:
        raise NotFound("no such step")
    has_card = step.stopped or Step.objects.filter(pk=step.pk).needs_you().exists()
    if has_card and task.status != Task.Status.CANCELLED:
        return redirect(f"{task.get_absolute_url()}#attention-{position}")
    messages.info(
        request,
        MSG_NO_LONGER_WAITS.format(position=position, status=step.get_status_display()),
    )
    return redirect(f"{task.get_absolute_url()}#step-{position}")


@require_GET
@login_required
def task_resume_context(request: HttpRequest, pk: int) -> HttpResponse:
    task = task_get_for_user(user=request.user, task_id=pk, staff=staff_reads(request))
    document = task_resume_context_json(task=task)
    if request.htmx:
        return render(
            request,
            "dashboard/_resume_context.html",
            {"task": task, "document": document},
        )
    return HttpResponse(document, content_type="application/json")


@require_GET
@login_required
def step_saved_output(request: HttpRequest, pk: int, step_id: int) -> HttpResponse:
    """Serve the output an interrupted call saved, so Dad sees what "use it" adopts.

    Only the step's own envelope names the blob (no artifact row exists yet).
    Never rendered inline unless it is a picture (raster or SVG); always
    sandboxed.
    """
    step = step_get_for_user(
        user=request.user, task_id=pk, step_id=step_id, staff=staff_reads(request)
    )
    saved = saved_output(envelope_read(step.pk).payload)
    if saved is None:
        raise NotFound("this step has no saved output waiting")
    try:
        handle = default_store().open(saved.sha)
    except (BlobError, OSError) as exc:
        raise NotFound("the saved output is gone") from exc
    inline = saved.preview in ("image", "svg")
    if saved.preview in ("excerpt", "headlines"):
        content_type = "text/plain; charset=utf-8"
    elif inline:
        content_type = saved.media_type
    else:
        content_type = "application/octet-stream"
    response = FileResponse(
        handle,
        content_type=content_type,
        as_attachment=not inline and saved.preview not in ("excerpt", "headlines"),
        filename=f"step-{step.position}-saved-output",
    )
    response["X-Content-Type-Options"] = "nosniff"
    # Sandboxed, no script: an SVG is drawn only through an <img>, which never
    # runs one, and opened on its own it runs none either.
    response["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; sandbox"
    )
    return file_streamed(request, response)


def _after_action(request: HttpRequest, task: Task) -> HttpResponse:
    """Re-render the live timeline for htmx, else redirect to the task page.

    The action's message goes out of band to the page's message region
    (``flash_messages``), which the live poll never replaces.
    """
    if not request.htmx:
        return redirect(task)
    task.refresh_from_db()
    return _task_page(request, task, "timeline")


def _confirm(request: HttpRequest, task: Task, context: dict) -> HttpResponse:
    """A page that says what an action will do before it is done."""
    return render(request, "dashboard/confirm.html", {"task": task, **context})


def _act(request: HttpRequest, do, message, /, **kwargs) -> bool:
    """Run one of Dad's actions as him; say it was done, or what happened instead.

    ``message`` is the words for success (a callable gets the task or step
    as it is after the action). A refusal is told in Dad's words, from where
    things stand now, as news rather than an error.
    """
    try:
        do(**kwargs, actor=_actor(request))
    except PippaError as exc:
        logger.info("refused %s: %s", do.__name__, exc)
        messages.info(request, _refusal(kwargs))
        return False
    messages.success(request, message() if callable(message) else message)
    return True


def _refusal(kwargs: dict) -> str:
    """Where things stand after a refused action, in Dad's words."""
    if "step" in kwargs:
        step = kwargs["step"]
        step.refresh_from_db()
        if step.status not in ATTENTION_STEPS:
            return MSG_ALREADY_DECIDED.format(
                position=step.position, status=step.get_status_display()
            )
        label = CHOICES.get(kwargs.get("action", "retry"), ("that", ""))[0]
        return MSG_NOT_A_CHOICE.format(label=label, position=step.position)
    task = kwargs["task"]
    task.refresh_from_db()
    blocked = (
        Step.objects.filter(
            task=task, status__in=[Step.Status.FAILED, Step.Status.NEEDS_REVIEW]
        )
        .order_by("position")
        .first()
    )
    if blocked is not None and task.is_open:
        return MSG_DECIDE_FIRST.format(
            position=blocked.position, status=blocked.get_status_display()
        )
    return MSG_TASK_MOVED_ON.format(status=task.get_status_display())


def _in_flight_words(task: Task, done: str, going: str) -> str:
    """``done`` when the task stopped at once, ``going`` while a step finishes."""
    task.refresh_from_db()
    step = step_in_flight(task=task)
    if step is None:
        return done.format(title=task.title)
    return going.format(title=task.title, position=step.position)


def _confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirm") == "yes"


def _to_confirmation(request: HttpRequest, url: str) -> HttpResponse:
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


@require_POST
@login_required
def task_resume(request: HttpRequest, pk: int) -> HttpResponse:
    task = task_get_for_user(user=request.user, task_id=pk)
    _act(request, actions.task_resume, MSG_QUEUED.format(title=task.title), task=task)
    return _after_action(request, task)


@require_POST
@login_required
def task_pause(request: HttpRequest, pk: int) -> HttpResponse:
    task = task_get_for_user(user=request.user, task_id=pk)
    words = partial(_in_flight_words, task, MSG_PAUSED, MSG_PAUSING)
    _act(request, actions.task_pause, words, task=task)
    return _after_action(request, task)


@require_http_methods(["GET", "POST"])
@login_required
def task_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    task = task_get_for_user(user=request.user, task_id=pk)
    if request.method == "POST" and _confirmed(request):
        words = partial(_in_flight_words, task, MSG_CANCELLED, MSG_CANCELLING)
        _act(request, actions.task_cancel, words, task=task)
        return redirect(task)
    if request.method == "POST":
        return _to_confirmation(
            request, reverse("dashboard:task_cancel", args=[task.pk])
        )
    running = not task.is_idle and task.lease_live
    return _confirm(
        request,
        task,
        {
            "heading": f"Cancel “{task.title}”?",
            "happens": [
                "The step running now finishes and its output is saved; no further step starts."
                if running
                else "No further step starts.",
                _steps_left_words(task.steps_total - task.steps_done),
                "Nothing is deleted: finished steps and their outputs stay.",
                "A cancelled task cannot be resumed. To go on later, branch it from a finished step.",
            ],
            "action": reverse("dashboard:task_cancel", args=[task.pk]),
            "button": "Yes, cancel the task",
            "danger": True,
            "refused": ""
            if task.is_open
            else f"This task is {task.get_status_display()}: there is nothing to cancel.",
        },
    )


def _steps_left_words(left: int) -> str:
    if not left:
        return "Every step is already done."
    if left == 1:
        return "The one step not yet done is left as it is."
    return f"The {left} steps not yet done are left as they are."


def _step_confirm_context(step, action: str) -> dict:
    label, words = CHOICES[action]
    happens = [words]
    warning = ""
    if step.side_effects and action in ("rerun", "retry"):
        happens.insert(
            0,
            f"“{step.title}” acts outside Pippa ({step.tool}): doing it again may "
            "reach the outside world a second time.",
        )
        warning = OUTSIDE_RERUN if action == "rerun" else OUTSIDE_RETRY
    happens.append("After that the task goes back to the worker by itself.")
    return {
        "heading": f"{label}: step {step.position}, “{step.title}”?",
        "happens": happens,
        "warning": warning,
        "button": f"Yes, {label[0].lower()}{label[1:]}",
        "danger": bool(warning),
    }


@require_http_methods(["GET", "POST"])
@login_required
def step_retry(request: HttpRequest, pk: int, step_id: int) -> HttpResponse:
    step = step_get_for_user(user=request.user, task_id=pk, step_id=step_id)
    url = reverse("dashboard:step_retry", args=[pk, step.pk])
    if request.method == "GET":
        return _confirm(
            request, step.task, {**_step_confirm_context(step, "retry"), "action": url}
        )
    if step.side_effects and not _confirmed(request):
        return _to_confirmation(request, url)
    message = MSG_RETRIED.format(position=step.position)
    _act(request, actions.step_retry, message, step=step)
    return _after_action(request, step.task)


@require_http_methods(["GET", "POST"])
@login_required
def step_resolve(request: HttpRequest, pk: int, step_id: int) -> HttpResponse:
    step = step_get_for_user(user=request.user, task_id=pk, step_id=step_id)
    url = reverse("dashboard:step_resolve", args=[pk, step.pk])
    if request.method == "GET":
        action = request.GET.get("action", "")
        if action not in actions.ACTIONS:
            raise NotFound("no such choice")
        return _confirm(
            request,
            step.task,
            {
                **_step_confirm_context(step, action),
                "action": url,
                "fields": {"action": action},
            },
        )
    action = request.POST.get("action", "")
    if action == "rerun" and step.side_effects and not _confirmed(request):
        return _to_confirmation(request, f"{url}?{urlencode({'action': action})}")
    label = RESOLVE_LABELS.get(action, action)
    message = MSG_RESOLVED.format(position=step.position, action=label)
    _act(request, actions.step_resolve, message, step=step, action=action)
    return _after_action(request, step.task)


@require_http_methods(["GET", "POST"])
@login_required
def task_branch(request: HttpRequest, pk: int) -> HttpResponse:
    task = task_get_for_user(user=request.user, task_id=pk)
    source = request.POST if request.method == "POST" else request.GET
    position = _int_or_none(source.get("after_position"))
    if position is None:
        messages.error(request, MSG_BAD_POSITION)
        return redirect(task)
    url = reverse("dashboard:task_branch", args=[task.pk])
    if request.method == "GET":
        return _confirm(request, task, _branch_confirm_context(task, position, url))
    if not _confirmed(request):
        return _to_confirmation(
            request, f"{url}?{urlencode({'after_position': position})}"
        )
    try:
        branch = actions.task_branch(
            task=task, after_position=position, actor=_actor(request)
        )
    except PippaError as exc:
        messages.error(request, str(exc))
        return redirect(task)
    messages.success(request, MSG_BRANCHED.format(position=position))
    return redirect(branch)


def _branch_confirm_context(task: Task, position: int, url: str) -> dict:
    steps = list(
        Step.objects.filter(task=task)
        .order_by("position")
        .values("position", "title", "side_effects")[: STEPS_PER_PAGE * 2]
    )
    again = [s for s in steps if s["position"] > position]
    outside = [s for s in again if s["side_effects"]]
    happens = [
        f"A new task starts in this conversation. It keeps steps 1–{position} "
        "with their outputs (nothing is called again for them)."
        if position
        else "A new task starts in this conversation and runs the whole plan again.",
        f"It runs {len(again)} step{pluralize(len(again))} again: "
        + ", ".join(
            f"{s['position']}. {s['title']}" for s in again[:BRANCH_STEPS_NAMED]
        )
        + ("…" if len(again) > BRANCH_STEPS_NAMED else ""),
        "This task is not changed.",
    ]
    warning = ""
    if outside:
        warning = (
            "These steps act outside Pippa and will do so again in the new task: "
            + ", ".join(f"{s['position']}. {s['title']}" for s in outside)
            + "."
        )
    return {
        "heading": f"Branch “{task.title}” after step {position}?",
        "happens": happens,
        "warning": warning,
        "action": url,
        "fields": {"after_position": position},
        "button": f"Yes, branch after step {position}",
        "danger": bool(warning),
    }


MSG_ATTACHED = "Attached “{title}” ({size}) to this task."
MSG_ALREADY_ATTACHED = "You had stored these bytes already: “{title}” is attached."
ERR_NO_FILE = "Choose a file to attach."
ERR_UPLOAD_TOO_LARGE = (
    "That file is larger than this page takes ({limit}); attach it through the "
    "JSON API instead."
)


@require_POST
@login_required
def task_upload(request: HttpRequest, pk: int) -> HttpResponse:
    """Attach a file to one of the user's own tasks, as the API's upload does
    (``tasks.services.task_artifact_upload``: the owner's quota, write before
    show); every refusal is a message on the task page, and leaves nothing."""
    task = task_get_for_user(user=request.user, task_id=pk)
    upload = request.FILES.get("file")
    if upload is None:
        messages.error(request, ERR_NO_FILE)
        return redirect(task)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if upload.size > limit:
        messages.error(
            request, ERR_UPLOAD_TOO_LARGE.format(limit=filesizeformat(limit))
        )
        return redirect(task)
    title = request.POST.get("title", "").strip() or upload.name
    try:
        artifact = task_services.task_artifact_upload(
            task=task,
            stream=upload.chunks(),
            media_type=upload.content_type or "application/octet-stream",
            artifact_class=request.POST.get("artifact_class", "3"),
            title=title,
            max_bytes=limit,
            expected_size=upload.size,
        )
    except PippaError as exc:
        messages.error(request, str(exc))
        return redirect(task)
    if getattr(artifact, "_created", True):
        size = filesizeformat(artifact.size)
        messages.success(request, MSG_ATTACHED.format(title=artifact.title, size=size))
    else:
        messages.success(request, MSG_ALREADY_ATTACHED.format(title=artifact.title))
    return redirect(task)
