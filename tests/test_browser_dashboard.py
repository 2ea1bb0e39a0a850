"""Dad in a real browser: conversations, a task's live timeline, and the actions on it.

Each test saves screenshots under var/screenshots/ (desktop and phone widths).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tasks.executor import step
from tasks.models import Conversation, Step, Task
from tasks.plan import task_create
from tests.support.leftovers import assert_no_leftovers, subtree_snapshot
from tests.tasks.dashboard_data import showcase

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
LIVE_TIMEOUT = 45_000  # ms: the worker is a separate process with real pauses


@pytest.fixture
def data(logged_in_page, make_conversation, make_task):
    return showcase(logged_in_page.user, make_conversation, make_task)


def _mark_page(page) -> None:
    """Put a marker in the window; a full reload would lose it."""
    page.evaluate("window.__pippaNoReload = true")


def _not_reloaded(page) -> bool:
    return page.evaluate("window.__pippaNoReload === true")


def test_dad_opens_a_conversation_and_a_task_at_desktop_and_phone_widths(
    logged_in_page, data, screenshot
):
    page = logged_in_page
    for name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.goto(f"{page.base_url}/")
        page.get_by_role("link", name="Tomato prices this summer").wait_for()
        screenshot(page, f"dashboard-list-{name}")
        page.get_by_role("link", name="Tomato prices this summer").click()
        page.get_by_role("heading", name="Tomato prices this summer").wait_for()
        expect(page.get_by_text("4 of 6 steps")).to_be_visible()
        screenshot(page, f"dashboard-conversation-{name}")
        page.get_by_role("link", name="Email the summary to the family").click()
        expect(page.get_by_text("What Pippa would do by itself")).to_be_visible()
        screenshot(page, f"dashboard-task-review-{name}")
        page.go_back()
        page.get_by_role("link", name="Chart weekly tomato prices").click()
        expect(page.get_by_role("heading", name="Steps")).to_be_visible()
        thumbs = page.locator("img.thumb")
        expect(thumbs).to_have_count(2)
        for i in range(2):  # the PNG and the widget's PNG preview really load
            thumbs.nth(i).scroll_into_view_if_needed()
            thumbs.nth(i).evaluate("img => img.decode().then(() => img.naturalWidth)")
            assert thumbs.nth(i).evaluate("img => img.naturalWidth") > 0
        page.evaluate("window.scrollTo(0, 0)")
        expect(page.locator(".resume-words")).to_contain_text("It will be told:")
        summary = page.locator(".resume-card summary")
        summary.focus()
        page.keyboard.press("Enter")  # keyboard opens the panel; htmx loads it
        expect(page.locator("pre.json")).to_contain_text('"schema": "pippa.resume/3"')
        screenshot(page, f"dashboard-task-running-{name}")


def test_search_filters_the_list_as_dad_types_without_a_reload(
    logged_in_page, make_conversation, screenshot
):
    page = logged_in_page
    for title in ("Garden plans", "Tomato prices", "Holiday photos"):
        make_conversation(owner=page.user, title=title)
    page.goto(f"{page.base_url}/")
    _mark_page(page)
    page.get_by_role("searchbox").fill("toma")
    expect(page.get_by_role("link", name="Garden plans")).to_have_count(0)
    expect(page.get_by_role("link", name="Tomato prices")).to_be_visible()
    assert _not_reloaded(page)
    assert "q=toma" in page.url
    screenshot(page, "dashboard-search")


def test_a_running_tasks_timeline_updates_live_and_stops_polling_when_done(
    logged_in_page, make_conversation, worker, screenshot
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="Live run")
    task = task_create(
        conversation=conversation,
        title="Three slow fetches",
        brain="claude",
        steps=[
            {"title": f"Fetch part {n}", "tool": "demo.closes", "args": {"pause": 2.5}}
            for n in (1, 2, 3)
        ],
    )
    page.goto(f"{page.base_url}{task.get_absolute_url()}")
    expect(page.locator("#timeline")).to_contain_text("0 of 3 steps done")
    expect(page.locator(".live.on")).to_be_visible()
    _mark_page(page)

    child = worker(task.pk)
    # Mid-run: the first step shows as done while the task is still live.
    expect(page.locator("#step-1 .status-done")).to_be_visible(timeout=LIVE_TIMEOUT)
    page.locator("#step-1 details.step-details summary").click()  # a fold Dad opened
    expect(page.locator("#step-3 .status-done")).to_have_count(0)
    expect(page.locator(".live.on")).to_be_visible()
    # Live updates swap only the rows that changed: the fold stays open, and
    # every row's bars share the axis the last update brought.
    expect(page.locator("#step-2 .status-done")).to_be_visible(timeout=LIVE_TIMEOUT)
    assert (
        page.locator("#step-1 details.step-details").get_attribute("open") is not None
    )
    axis = page.locator("#axis-note").get_attribute("data-axis")
    boxes = page.locator("#timeline svg.bars").evaluate_all(
        "svgs => svgs.map(s => s.getAttribute('viewBox'))"
    )
    assert boxes
    assert (
        set(boxes) <= {f"0 0 {axis} 14"}
        or page.locator("#axis-note").get_attribute("data-axis") != axis
    )  # an update landed in between
    screenshot(page, "dashboard-live-midway")
    expect(page.locator("#timeline")).to_contain_text(
        "3 of 3 steps done", timeout=LIVE_TIMEOUT
    )
    expect(page.locator(".live.idle")).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(page.locator("#step-3 .status-done")).to_be_visible()
    assert _not_reloaded(page)
    # The idle timeline carries no trigger: htmx stops polling.
    assert page.locator("#live").get_attribute("hx-trigger") is None
    assert child.wait(timeout=60) == 0
    screenshot(page, "dashboard-live-done")

    # The event log is folded; opening it draws it in place, and it filters
    # by kind in place.
    expect(page.locator("#events table")).to_have_count(0)
    page.locator("#events-fold summary").click()
    expect(page.locator("#events tbody tr:not(.group-head)")).not_to_have_count(0)
    # htmx shows the swapped rows at once but wires the filter form up only
    # when it settles (and takes the class away then): a choice made before
    # that would have no listener.
    expect(page.locator("#events")).not_to_have_class(re.compile(r"\bhtmx-added\b"))
    page.select_option("#event-kind", "tool_result_persisted")
    expect(page.locator("#events tbody tr:not(.group-head)")).to_have_count(3)
    expect(page.locator("#events table")).not_to_contain_text("task created")
    assert _not_reloaded(page)


def test_dad_retries_a_failed_step_and_watches_it_finish(
    logged_in_page, make_conversation, worker, screenshot
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="Flaky search")
    task = task_create(
        conversation=conversation,
        title="Search the news",
        steps=[
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
            {
                "title": "Search for tomato news",
                "tool": "demo.search",
                "args": {"query": "tomato", "fail_until_generation": 1, "pause": 0.5},
                "max_attempts": 1,
            },
        ],
    )
    for _ in range(4):
        step(task_id=task.pk, worker_id="worker:earlier")
    task.refresh_from_db()
    assert task.status == Task.Status.FAILED

    for name, size in (("phone", PHONE), ("desktop", DESKTOP)):
        page.set_viewport_size(size)
        page.goto(f"{page.base_url}{task.get_absolute_url()}")
        expect(page.get_by_role("heading", name="Step 2 needs you")).to_be_visible()
        screenshot(page, f"dashboard-failed-{name}")
    _mark_page(page)
    page.get_by_role("button", name="Start this step over").click()
    expect(page.get_by_text("Step 2 will run again.")).to_be_visible()
    expect(page.locator(".live.on")).to_be_visible()
    worker(task.pk)
    expect(page.locator("#timeline")).to_contain_text(
        "2 of 2 steps done", timeout=LIVE_TIMEOUT
    )
    expect(page.locator("#step-2 .status-done")).to_be_visible()
    assert _not_reloaded(page)
    assert Step.objects.get(task=task, position=2).generation == 1
    screenshot(page, "dashboard-retried-done")


def test_dad_opens_an_artifact_from_the_timeline(
    logged_in_page, make_conversation, screenshot
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="Charts")
    task = task_create(
        conversation=conversation,
        title="Chart the closes",
        steps=[
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
            {"title": "Draw the chart", "tool": "demo.chart", "args": {"source": 1}},
        ],
    )
    for _ in range(4):
        step(task_id=task.pk, worker_id="worker:earlier")
    chart = Step.objects.select_related("output").get(task=task, position=2).output
    page.goto(f"{page.base_url}{task.get_absolute_url()}")
    screenshot(page, "dashboard-chart-task")
    page.locator("#step-2 .output-meta a").first.click()
    page.wait_for_url(f"{page.base_url}/artifacts/{chart.pk}/")
    # The picture first; the hash only under an engineer's Details.
    expect(page.locator(".artifact-first img.detail-preview")).to_be_visible()
    expect(page.get_by_text(chart.sha256[:12]).first).to_be_hidden()
    screenshot(page, "dashboard-artifact")
    page.get_by_text("Details for an engineer").click()
    expect(page.get_by_text(chart.sha256[:12]).first).to_be_visible()


def test_dad_deletes_a_conversation_through_the_confirmation(
    logged_in_page, data, screenshot
):
    page = logged_in_page
    conversation = data["conversation"]
    before = subtree_snapshot(conversation.pk)
    page.goto(f"{page.base_url}{conversation.get_absolute_url()}")
    page.get_by_role("link", name="Delete this conversation…").click()
    expect(page.get_by_role("heading", name="Will be removed")).to_be_visible()
    expect(page.locator(".counts").first).to_contain_text("task")
    screenshot(page, "dashboard-delete-confirm")
    page.set_viewport_size(PHONE)
    screenshot(page, "dashboard-delete-confirm-phone")
    page.get_by_role("button", name="Delete this conversation").click()
    page.wait_for_url(f"{page.base_url}/")
    expect(page.get_by_text("Deleted “Tomato prices this summer”")).to_be_visible()
    screenshot(page, "dashboard-deleted")
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert_no_leftovers(before)
