"""Dad's dashboard: conversations, task timelines, and the actions on them.

Views stay thin: a selector or one service, then ``render`` or a redirect
(POST-redirect-GET). htmx requests get the fragment they target
(``task_detail.html#timeline`` / ``#events``) instead of the whole page.
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render, resolve_url
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from tasks import selectors
from tasks.models import Task

FRAGMENTS = ("timeline", "events")
MSG_QUEUED = "Queued “{title}” for the worker."
MSG_RETRIED = "Step {position} will run again."
MSG_RESOLVED = "Step {position}: {action}."
MSG_BRANCHED = "Branched a new task that keeps steps 1–{position}."
MSG_DELETED = "Deleted “{title}” with {summary}."
MSG_BAD_POSITION = "Choose a step to branch from."
# DeletionReport.removed_counts() keys, in words Dad knows: (one, many).
COUNT_LABELS = {
    "conversations": ("conversation", "conversations"),
    "rounds": ("council round", "council rounds"),
    "turns": ("council turn", "council turns"),
    "tasks": ("task", "tasks"),
    "steps": ("step", "steps"),
    "events": ("log event", "log events"),
    "links": ("artifact link", "artifact links"),
    "artifacts": ("artifact", "artifacts"),
}
RESOLVE_LABELS = {
    "adopt": "adopted the saved output",
    "rerun": "will run again",
    "fail": "marked failed",
    "skip": "skipped",
}


def dashboard_login_required(view):
    """``login_required``, but an htmx request (a poll after the session ended)
    gets a whole-page redirect to the login page instead of the login form
    swapped into the middle of the page."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.htmx and not request.user.is_authenticated:
            next_url = request.htmx.current_url_abs_path or request.get_full_path()
            login = resolve_url(settings.LOGIN_URL)
            return HttpResponseClientRedirect(
                f"{login}?{urlencode({'next': next_url})}"
            )
        return login_required(view)(request, *args, **kwargs)

    return wrapper


def _counted(report, skip: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    """Return a deletion report's counts as (words, number), in report order."""
    return [
        (COUNT_LABELS.get(key, (key, key))[n != 1], n)
        for key, n in report.removed_counts().items()
        if key not in skip
    ]


def _actor(request: HttpRequest) -> str:
    role = "staff" if request.user.is_staff else "user"
    return f"{role}:{request.user.get_username()}"


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@require_GET
@dashboard_login_required
def conversation_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")[:200]
    page = selectors.conversation_page(
        user=request.user, query=query, page=request.GET.get("page")
    )
    template = "tasks/conversation_list.html"
    if request.htmx and request.htmx.target == "conversation-results":
        template += "#results"
    return render(request, template, {"page": page, "query": query})


@require_GET
@dashboard_login_required
def conversation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    conversation = selectors.conversation_get_for_user(
        user=request.user, conversation_id=pk
    )
    context = {
        "conversation": conversation,
        "tasks": selectors.conversation_tasks(conversation=conversation),
        "rounds": selectors.conversation_rounds(conversation=conversation),
    }
    return render(request, "tasks/conversation_detail.html", context)


@require_http_methods(["GET", "POST"])
@dashboard_login_required
def conversation_delete(request: HttpRequest, pk: int) -> HttpResponse:
    from tasks.services import conversation_delete, conversation_deletion_preview

    conversation = selectors.conversation_get_for_user(
        user=request.user, conversation_id=pk
    )
    if request.method == "POST":
        report = conversation_delete(conversation_id=conversation.pk)
        summary = ", ".join(
            f"{n} {words}"
            for words, n in _counted(report, skip=("conversations",))
            if n
        )
        messages.success(
            request, MSG_DELETED.format(title=conversation.title, summary=summary)
        )
        return redirect("tasks:conversations")
    report = conversation_deletion_preview(conversation=conversation)
    return render(
        request,
        "tasks/conversation_delete.html",
        {"conversation": conversation, "report": report, "counts": _counted(report)},
    )


def _task_page(request: HttpRequest, task: Task, fragment: str | None) -> HttpResponse:
    context: dict = {"task": task, "follow": "page" not in request.GET}
    if fragment != "events":
        context["step_page"], context["rows"] = selectors.task_timeline(
            task=task, page=request.GET.get("page")
        )
    if fragment != "timeline":
        context["events"] = selectors.task_events(
            task=task,
            kind=request.GET.get("kind", "")[:40],
            before=_int_or_none(request.GET.get("before")),
        )
        context["event_kinds"] = selectors.event_kinds()
    template = "tasks/task_detail.html" + (f"#{fragment}" if fragment else "")
    return render(request, template, context)


@require_GET
@dashboard_login_required
def task_detail(request: HttpRequest, pk: int) -> HttpResponse:
    task = selectors.task_get_for_user(user=request.user, task_id=pk)
    target = request.htmx.target if request.htmx else None
    return _task_page(request, task, target if target in FRAGMENTS else None)


@require_GET
@dashboard_login_required
def task_resume_context(request: HttpRequest, pk: int) -> HttpResponse:
    task = selectors.task_get_for_user(user=request.user, task_id=pk)
    document = selectors.task_resume_context_json(task=task)
    if request.htmx:
        return render(
            request, "tasks/_resume_context.html", {"task": task, "document": document}
        )
    return HttpResponse(document, content_type="application/json")


def _after_action(request: HttpRequest, task: Task) -> HttpResponse:
    """Re-render the live timeline for htmx, else redirect to the task page."""
    if request.htmx:
        task.refresh_from_db()
        return _task_page(request, task, "timeline")
    return redirect(task)


@require_POST
@dashboard_login_required
def task_resume(request: HttpRequest, pk: int) -> HttpResponse:
    from tasks.executor import ExecutorError, task_resume

    task = selectors.task_get_for_user(user=request.user, task_id=pk)
    try:
        task_resume(task=task, actor=_actor(request))
        messages.success(request, MSG_QUEUED.format(title=task.title))
    except ExecutorError as exc:
        messages.error(request, str(exc))
    return _after_action(request, task)


@require_POST
@dashboard_login_required
def step_retry(request: HttpRequest, pk: int, step_id: int) -> HttpResponse:
    from tasks.executor import ExecutorError, step_retry

    step = selectors.step_get_for_user(user=request.user, task_id=pk, step_id=step_id)
    try:
        step_retry(step=step, actor=_actor(request))
        messages.success(request, MSG_RETRIED.format(position=step.position))
    except ExecutorError as exc:
        messages.error(request, str(exc))
    return _after_action(request, step.task)


@require_POST
@dashboard_login_required
def step_resolve(request: HttpRequest, pk: int, step_id: int) -> HttpResponse:
    from tasks.executor import ExecutorError, step_resolve

    step = selectors.step_get_for_user(user=request.user, task_id=pk, step_id=step_id)
    action = request.POST.get("action", "")
    try:
        step_resolve(step=step, action=action, actor=_actor(request))
        label = RESOLVE_LABELS.get(action, action)
        messages.success(
            request, MSG_RESOLVED.format(position=step.position, action=label)
        )
    except ExecutorError as exc:
        messages.error(request, str(exc))
    return _after_action(request, step.task)


@require_POST
@dashboard_login_required
def task_branch(request: HttpRequest, pk: int) -> HttpResponse:
    from tasks.executor import ExecutorError, task_branch

    task = selectors.task_get_for_user(user=request.user, task_id=pk)
    position = _int_or_none(request.POST.get("after_position"))
    if position is None:
        messages.error(request, MSG_BAD_POSITION)
        return redirect(task)
    try:
        branch = task_branch(task=task, after_position=position, actor=_actor(request))
    except ExecutorError as exc:
        messages.error(request, str(exc))
        return redirect(task)
    messages.success(request, MSG_BRANCHED.format(position=position))
    return redirect(branch)
