"""Dad in a real browser: he finds what needs him, decides once, confirms what acts
outside, pauses and cancels a running task, and reads a retried step's attempts."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tasks.management.commands.pippa_demo import INTERRUPTED, interrupt
from tasks.models import Step, Task
from tasks.plan import task_create
from tests.support.executing import boundary_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT = 45_000  # ms: the worker is a separate process with real pauses


def _four_steps(pause: float = 0) -> list[dict]:
    from tasks.demo import four_steps

    return four_steps(pause=pause)


def test_dad_finds_the_interrupted_task_from_the_list_decides_once_and_watches_it_finish(
    logged_in_page, make_conversation, worker, screenshot
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="PIPA, interrupted")
    make_conversation(owner=page.user, title="Nothing to see")
    task = task_create(
        conversation=conversation,
        title="Stopped after the search snapshot was saved",
        steps=_four_steps(),
    )
    # A step left by the three-commit executor: its snapshot saved, no result.
    point, legacy = boundary_of("after_payload:3")
    with legacy:
        interrupt(task, point)

    page.goto(f"{page.base_url}/")
    page.get_by_role("link", name="Needs you (1 conversation)").click()
    expect(page.get_by_role("link", name="Nothing to see")).to_have_count(0)
    expect(page.locator("#conversation-results .badge.needs-you")).to_contain_text(
        "Needs you: 1 decision"
    )
    page.get_by_role("link", name="PIPA, interrupted").click()
    page.get_by_role("link", name=task.title).click()

    card = page.locator(".card.attention")
    expect(card).to_contain_text("Step 3 needs you: Search the news")
    expect(card).to_contain_text("What Pippa would do by itself")
    expect(card.locator(".saved-output ol.headlines")).to_contain_text("PIPA")
    expect(page.locator("#resume-button")).to_have_count(0)  # one way forward
    screenshot(page, "flow-decision")

    card.get_by_role("button", name="Use the saved output").click()
    expect(page.get_by_text("the task goes on by itself")).to_be_visible()
    expect(page.locator(".live.on")).to_be_visible()
    worker(task.pk)
    expect(page.locator("#timeline")).to_contain_text(
        "4 of 4 steps done", timeout=LIVE_TIMEOUT
    )
    expect(page.get_by_text("the task goes on by itself")).to_be_visible()
    task.refresh_from_db()
    assert task.status == Task.Status.DONE
    screenshot(page, "flow-decided-done")


def test_dad_cannot_resend_an_outside_call_or_branch_without_confirming(
    logged_in_page, make_conversation
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="A note to Dad")
    title, point, plan = INTERRUPTED[-1]
    task = task_create(conversation=conversation, title=title, steps=plan)
    interrupt(task, point)
    notify = task.steps.get()

    page.goto(f"{page.base_url}{task.get_absolute_url()}")
    expect(page.locator(".card.attention")).to_contain_text("acts outside Pippa")
    expect(page.get_by_role("button", name="Run the same call again")).to_have_count(0)
    page.get_by_role("link", name="Run the same call again…").click()
    expect(page.get_by_role("heading", name="What will happen")).to_be_visible()
    expect(page.locator(".confirm-warning")).to_contain_text("Careful")
    page.get_by_role("link", name="No, go back").click()
    expect(page.locator(".card.attention")).to_be_visible()
    notify.refresh_from_db()
    assert notify.status == Step.Status.RUNNING  # nothing was sent again

    page.get_by_role("link", name="Run the same call again…").click()
    page.get_by_role("button", name="Yes, run the same call again").click()
    expect(page.get_by_text("the same call runs again")).to_be_visible()
    notify.refresh_from_db()
    assert notify.status == Step.Status.PENDING

    done = task_create(
        conversation=conversation,
        title="Two steps",
        steps=_four_steps()[:2],
    )
    from tasks.executor import step

    for _ in range(3):
        step(task_id=done.pk, worker_id="worker:earlier")
    page.goto(f"{page.base_url}{done.get_absolute_url()}")
    expect(page.get_by_role("link", name="Change course after step 2…")).to_have_count(
        0
    )
    page.get_by_role("link", name="Change course after step 1…").click()
    expect(page.get_by_role("heading", name="What will happen")).to_be_visible()
    expect(page.locator(".happens")).to_contain_text("It runs 1 step again")
    assert Task.objects.filter(branched_from=done).count() == 0
    page.get_by_role("button", name="Yes, branch after step 1").click()
    expect(
        page.get_by_text("Branched a new task that keeps steps 1–1.")
    ).to_be_visible()
    assert Task.objects.filter(branched_from=done).count() == 1


def test_dad_pauses_and_cancels_a_running_task(
    logged_in_page, make_conversation, worker, screenshot
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="Slow work")
    task = task_create(
        conversation=conversation, title="Slow chart", steps=_four_steps(pause=5)
    )
    page.goto(f"{page.base_url}{task.get_absolute_url()}")
    first = worker(task.pk)
    expect(page.locator("#now-line")).to_contain_text("Now: step", timeout=LIVE_TIMEOUT)
    page.get_by_role("button", name="Pause after this step").click()
    # A step is in flight (each takes 5 s): the tab says so, keeps asking, and
    # without a reload says where the task stopped once the worker lets go.
    expect(page.locator("#messages")).to_contain_text("“Slow chart”")
    expect(page.locator("#now-line")).to_contain_text(
        "Paused after step", timeout=LIVE_TIMEOUT
    )
    assert first.wait(timeout=60) == 0  # the worker let go at the boundary
    task.refresh_from_db()
    assert task.status == Task.Status.PAUSED
    assert task.lease_owner == ""
    assert 0 < task.steps_done < 4
    assert not task.steps.filter(status=Step.Status.RUNNING).exists()
    done = task.steps_done
    expect(page.locator("#now-line")).to_contain_text(f"Paused after step {done}")
    expect(page.locator(f"#step-{done} .badge")).to_have_text("done")
    expect(page.locator(f"#step-{done + 1} .badge")).to_have_text("pending")
    expect(page.locator("#live")).to_have_attribute("hx-trigger", "every 10s")
    screenshot(page, "flow-paused")

    page.get_by_role("button", name="Resume: the worker carries on").click()
    second = worker(task.pk)
    expect(page.locator("#now-line")).to_contain_text("Now: step", timeout=LIVE_TIMEOUT)
    page.get_by_role("link", name="Cancel the task…").click()
    expect(page.get_by_role("heading", name="What will happen")).to_be_visible()
    expect(page.locator(".happens")).to_contain_text("cannot be resumed")
    page.get_by_role("button", name="Yes, cancel the task").click()
    expect(page.locator("#messages")).to_contain_text("“Slow chart”")
    expect(page.locator("#now-line")).to_contain_text(
        "Cancelled after step", timeout=LIVE_TIMEOUT
    )
    assert second.wait(timeout=60) == 0
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED
    assert task.steps_done < 4
    assert not task.steps.filter(status=Step.Status.RUNNING).exists()
    page.reload()
    expect(page.locator(".status-line")).to_contain_text("cancelled")
    expect(page.get_by_role("button", name="Pause after this step")).to_have_count(0)
    screenshot(page, "flow-cancelled")


def test_dad_sees_a_retried_steps_failed_attempts(
    logged_in_page, make_conversation, screenshot, settings
):
    from tasks.actions import step_retry
    from tasks.executor import step

    settings.PIPPA_RETRY_BASE_SECONDS = 0  # the history is built at once
    settings.PIPPA_RETRY_MAX_SECONDS = 0

    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="Outage")
    steps = _four_steps()
    steps[2] = {
        **steps[2],
        "args": {**steps[2]["args"], "fail_until_generation": 1},
        "max_attempts": 2,
    }
    task = task_create(
        conversation=conversation, title="Despite an outage", steps=steps
    )
    for _ in range(10):
        if step(task_id=task.pk, worker_id="worker:earlier") is None:
            break
    step_retry(step=task.steps.get(position=3), actor=f"user:{page.user.username}")
    for _ in range(10):
        if step(task_id=task.pk, worker_id="worker:earlier") is None:
            break

    page.goto(f"{page.base_url}{task.get_absolute_url()}")
    third = page.locator("#step-3")
    expect(third.locator(".attempts summary")).to_contain_text(
        "3 attempts, 2 that did not finish"
    )
    expect(third.locator(".attempt-failed")).to_have_count(2)
    expect(third.locator(".attempt-failed").first).to_contain_text("simulated outage")
    expect(third.locator(".step-notes")).to_contain_text(
        "started the step over as a new request"
    )
    expect(third.locator("svg.bars rect.bar")).to_have_count(3)
    expect(page.locator(".clock")).to_contain_text("from its first call to its last")
    screenshot(page, "flow-attempts")


def test_a_tab_left_open_on_a_decision_another_tab_took_corrects_itself(
    logged_in_page, make_conversation
):
    page = logged_in_page
    conversation = make_conversation(owner=page.user, title="Two windows")
    task = task_create(
        conversation=conversation, title="Decide once", steps=_four_steps()
    )
    # A step left by the three-commit executor: its snapshot saved, no result.
    point, legacy = boundary_of("after_payload:3")
    with legacy:
        interrupt(task, point)
    url = f"{page.base_url}{task.get_absolute_url()}"
    page.goto(url)
    stale = page.locator(".card.attention")
    expect(stale).to_contain_text("Step 3 needs you")
    expect(page.locator("#live")).to_have_attribute("hx-trigger", "every 10s")

    other = page.context.new_page()
    other.goto(url)
    other.locator(".card.attention").get_by_role(
        "button", name="Use the saved output"
    ).click()
    expect(other.get_by_text("the task goes on by itself")).to_be_visible()
    other.close()

    # Within one poll (10 s while it waits for a person), no reload.
    expect(page.locator(".card.attention")).to_have_count(0, timeout=15_000)
    expect(page.locator("#step-3 .badge")).to_have_text("done")
