"""An operator repairs a task in the admin with a real browser, under the site's CSP."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from artifacts.models import ArtifactClass
from tasks import crashpoints, executor
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tasks.tools import ToolResult, tool_register

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
DEAD_WORKER = "worker:dead-host"


def _quote(ctx, **args):
    """A live quote: a snapshot."""
    return ToolResult(data=b"quote: 101.25")


def _chart(ctx, **args):
    """A chart of the quote."""
    return ToolResult(data=b"<svg xmlns='http://www.w3.org/2000/svg'/>")


tool_register("browseradmin_quote", _quote, artifact_class=ArtifactClass.SNAPSHOT)


def _post(ctx, **args):
    """Posts the chart to the family chat: outside effects."""
    return ToolResult(data=b"posted")


tool_register("browseradmin_chart", _chart, artifact_class=ArtifactClass.FETCH)
tool_register("browseradmin_post", _post, side_effects=True)


@pytest.fixture
def console_errors(page):
    """Collect console errors and page errors (CSP violations show up here)."""
    errors: list[str] = []
    page.on(
        "console",
        lambda msg: errors.append(msg.text) if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


@pytest.fixture
def operator_page(page, live_server, make_user):
    make_user(username="operator", is_staff=True, is_superuser=True)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    page.base_url = live_server.url
    return page


def _task_left_by_a_dead_worker(
    make_conversation, first_tool: str = "browseradmin_quote"
) -> Task:
    """A worker took the lease, logged tool_call_started, and died."""
    task = task_create(
        conversation=make_conversation(),
        title="Quote and chart for Dad",
        steps=[
            {"title": "Get the quote", "tool": first_tool, "args": {}},
            {"title": "Chart it", "tool": "browseradmin_chart", "args": {}},
        ],
    )
    crashpoints.arm("after_started", action="raise")
    try:
        with pytest.raises(crashpoints.SimulatedCrash):
            executor.step(task_id=task.pk, worker_id=DEAD_WORKER)
    finally:
        crashpoints.disarm()
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() - timedelta(minutes=10)
    )
    return task


def _run_action(page, task: Task, action: str) -> None:
    page.check(f"input[name=_selected_action][value='{task.pk}']")
    page.select_option("select[name=action]", action)
    with page.expect_navigation():
        page.get_by_role("button", name="Run").click()


def test_an_operator_finds_a_stale_lease_releases_it_and_the_task_resumes(
    operator_page, make_conversation, screenshot, console_errors
):
    page = operator_page
    task = _task_left_by_a_dead_worker(make_conversation)

    # Found: the "lease expired" filter lists it, marked stale.
    page.goto(f"{page.base_url}/admin/tasks/task/")
    page.get_by_role("link", name="Yes (stale: held, past expiry)").click()
    page.wait_for_url("**/admin/tasks/task/?lease_expired=yes")
    row = page.locator("#result_list tbody tr")
    assert row.count() == 1
    assert "Quote and chart for Dad" in row.inner_text()
    assert f"stale {DEAD_WORKER}" in row.inner_text()
    screenshot(page, "admin-1-stale-lease-found")

    # Released.
    _run_action(page, task, "release_stale_lease")
    assert page.get_by_text("Released the stale lease of 1 task(s).").is_visible()
    task.refresh_from_db()
    assert task.lease_owner == ""
    released = Event.objects.filter(task=task, kind=Event.Kind.LEASE_RELEASED).last()
    assert released.data["actor"] == "staff:operator"
    assert released.data["previous_owner"] == DEAD_WORKER
    screenshot(page, "admin-2-lease-released")

    # Resumed: queued by the operator, then a live worker finishes it.
    page.goto(f"{page.base_url}/admin/tasks/task/")
    _run_action(page, task, "resume_tasks")
    assert page.get_by_text("Queued 1 task(s) for the worker.").is_visible()
    queued = Event.objects.filter(task=task, kind=Event.Kind.TASK_QUEUED).last()
    assert queued.data["actor"] == "staff:operator"
    for _ in range(4):
        executor.step(task_id=task.pk, worker_id="worker:live-host")
    task.refresh_from_db()
    assert task.status == Task.Status.DONE
    assert list(task.steps.values_list("status", flat=True)) == ["done", "done"]
    # The snapshot was never persisted, so it was taken again, and logged as such.
    first = task.steps.get(position=1)
    assert Event.objects.filter(step=first, kind="tool_call_started").count() == 2

    page.goto(f"{page.base_url}/admin/tasks/task/{task.pk}/change/")
    assert page.locator(".field-status .readonly").inner_text() == "done"
    assert page.locator(".field-lease_state .readonly").inner_text() == "no lease"
    assert page.locator("#steps-group").get_by_text("Get the quote").first.is_visible()
    screenshot(page, "admin-3-task-resumed-and-done")

    page.goto(f"{page.base_url}/admin/tasks/event/?task__id__exact={task.pk}")
    assert page.get_by_text("staff:operator").first.is_visible()
    screenshot(page, "admin-4-events-name-the-operator")
    assert console_errors == []


def test_the_repair_pages_run_under_the_sites_csp_without_blocked_resources(
    operator_page, make_conversation, make_artifact, screenshot, console_errors
):
    from artifacts.preview import preview_render

    page = operator_page
    widget = make_artifact(
        data=(
            b'<svg xmlns="http://www.w3.org/2000/svg" width="60" height="30">'
            b'<rect width="60" height="30" fill="#2a7"/></svg>'
        ),
        media_type="image/svg+xml",
        artifact_class=ArtifactClass.RENDER,
        title="green widget",
    )
    assert preview_render(artifact=widget) is not None
    # A tool with outside effects died mid-call: resume sends it to a person.
    task = _task_left_by_a_dead_worker(make_conversation, "browseradmin_post")
    executor.step(task_id=task.pk, worker_id="worker:live-host")
    step = Step.objects.get(task=task, position=1)
    assert step.status == Step.Status.NEEDS_REVIEW
    pages = {
        "admin-index": "/admin/",
        "admin-task-list": "/admin/tasks/task/",
        "admin-task": f"/admin/tasks/task/{task.pk}/change/",
        "admin-step-list": "/admin/tasks/step/?needs_review=yes",
        "admin-step": f"/admin/tasks/step/{step.pk}/change/",
        "admin-resolve": f"/admin/tasks/step/{step.pk}/resolve/",
        "admin-branch": f"/admin/tasks/task/{task.pk}/branch/",
        "admin-doctor": "/admin/tasks/task/doctor/",
        "admin-artifacts": "/admin/artifacts/artifact/",
        "admin-artifact-widget": f"/admin/artifacts/artifact/{widget.pk}/change/",
        "admin-conversation-delete": (
            f"/admin/tasks/conversation/{task.conversation_id}/delete/"
        ),
        "admin-events": "/admin/tasks/event/",
        "admin-rounds": "/admin/council/councilround/",
    }
    for name, url in pages.items():
        response = page.goto(f"{page.base_url}{url}")
        assert response.status == 200, url
        assert "default-src 'self'" in response.headers["content-security-policy"]
        screenshot(page, name)
        if name == "admin-artifact-widget":
            image = page.get_by_alt_text(f"PNG preview of artifact {widget.pk}")
            assert image.evaluate("img => img.complete && img.naturalWidth > 0")
        if name == "admin-resolve":
            assert page.get_by_label("Run the same call again").is_visible()
            assert page.get_by_label("Skip this step").is_visible()
    assert console_errors == []
