"""Resume, retry, resolve and branch from the dashboard, through the executor's services."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease
from tests.support.stepping import run_steps

pytestmark = pytest.mark.django_db

WORKER = "worker:test-1"


def _run(task: Task, times: int = 10) -> Task:
    return run_steps(task, WORKER, times)


def _failed_search_task(conversation) -> Task:
    """A task whose search step fails until it is retried once."""
    task = task_create(
        conversation=conversation,
        title="Search then chart",
        steps=[
            {"title": "Fetch closes", "tool": "demo.closes", "args": {}},
            {
                "title": "Search the news",
                "tool": "demo.search",
                "args": {"fail_until_generation": 1},
                "max_attempts": 1,
            },
        ],
    )
    return _run(task)


def _crashed(conversation, tool: str, boundary: str) -> Task:
    """A task whose worker died at ``boundary`` inside its one step; lease expired."""
    task = task_create(
        conversation=conversation,
        title=f"Crash in {tool}",
        steps=[{"title": f"Run {tool}", "tool": tool, "args": {}}],
    )
    crash_at(task.pk, boundary, WORKER)
    expire_lease(task.pk)
    task.refresh_from_db()
    return task


def _actions(task: Task, step_obj: Step) -> dict[str, str]:
    return {
        "resume": reverse("dashboard:task_resume", args=[task.pk]),
        "branch": reverse("dashboard:task_branch", args=[task.pk]),
        "retry": reverse("dashboard:step_retry", args=[task.pk, step_obj.pk]),
        "resolve": reverse("dashboard:step_resolve", args=[task.pk, step_obj.pk]),
        "delete": reverse("dashboard:conversation_delete", args=[task.conversation_id]),
    }


# -- what the page says about a step that needs a person --------------------


def test_a_failed_step_says_what_happened_and_offers_retry_and_resolutions(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    assert task.status == Task.Status.FAILED
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "Step 2 needs you: <bdi>Search the news</bdi>" in body
    said = " ".join(body.split())
    assert "the step failed. The search service is unavailable" in said
    # The exception's name only in the engineer's fold.
    card = body[body.index('id="attention-2"') :]
    before_fold = card[: card.index('<details class="engineer">')]
    assert "Error" not in before_fold
    assert "ConnectionError" in card[: card.index("</details>")]
    assert ">Start this step over</button>" in body
    assert 'name="action" value="skip"' in body
    # One way forward: the decision card, and no second Resume button.
    assert 'id="resume-button"' not in body


@pytest.mark.parametrize(
    ("tool", "boundary", "plain", "engineer"),
    [
        (
            "demo.search",
            "after_payload",
            "The answer it got was saved: Pippa will use that saved answer",
            "will reuse the saved search snapshot",
        ),
        (
            "demo.closes",
            "after_started",
            "Fetching the same data again is safe: Pippa will fetch it again.",
            "will fetch again",
        ),
        (
            "demo.notify",
            "after_started",
            "This step acts outside Pippa (it sends or writes something).",
            "needs you: the tool has outside effects",
        ),
    ],
)
def test_an_uncertain_step_says_in_plain_words_what_resume_will_do(
    dad_client, conversation, tool, boundary, plain, engineer
):
    task = _crashed(conversation, tool, boundary)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "the call was made" in body
    assert "the worker stopped before" in body
    assert '<span class="badge status-needs_review">interrupted</span>' in body
    assert f"<strong>What Pippa would do by itself:</strong> {plain}" in body
    fold = body[body.index("Details for an engineer") :]
    assert f": {engineer}." in fold
    assert "The worker stopped answering" in body


def test_a_step_running_under_a_live_lease_asks_for_no_decision(
    dad_client, conversation
):
    task = _crashed(conversation, "demo.closes", "after_started")
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() + timezone.timedelta(minutes=1)
    )
    body = dad_client.get(task.get_absolute_url()).content.decode()
    assert "needs you" not in body
    assert "Lease held by <code>worker:test-1</code>" in body


def test_the_resume_context_opens_as_a_fragment_and_as_json(dad_client, conversation):
    task = _failed_search_task(conversation)
    url = reverse("dashboard:task_resume_context", args=[task.pk])
    fragment = dad_client.get(url, headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert "<html" not in fragment.content.decode()
    assert "pippa.resume/3" in fragment.content.decode()
    as_json = dad_client.get(url)
    assert as_json["Content-Type"] == "application/json"
    assert as_json.json()["next"][0]["position"] == 2


def test_the_task_page_says_in_words_what_a_brain_will_be_told_above_the_fold(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    body = dad_client.get(task.get_absolute_url()).content.decode()
    card = body[body.index('id="resume-heading"') :]
    words = card.index("It will be told: step 1 is done (with its result);")
    assert "step 2, " in card
    assert "waits for you before it can go on" in card
    fold = card.index("For engineers: the document itself")
    assert words < fold
    # The JSON itself is read only when the fold is opened.
    assert "pippa.resume/3" not in card[: card.index("</section>")]


# -- actions ------------------------------------------------------------------


def test_retry_queues_the_failed_step_and_the_worker_then_finishes_it(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    failed = task.steps.get(position=2)
    response = dad_client.post(_actions(task, failed)["retry"])
    assert response.status_code == 302
    assert response["Location"] == task.get_absolute_url()
    failed.refresh_from_db()
    assert failed.status == Step.Status.PENDING
    assert failed.generation == 1
    retried = Event.objects.get(task=task, kind=Event.Kind.STEP_RETRIED)
    assert retried.data["actor"] == "user:dad"
    page = dad_client.get(response["Location"]).content.decode()
    assert "Step 2 will run again." in page
    assert _run(task).status == Task.Status.DONE


def test_retry_from_htmx_returns_the_live_timeline_fragment(dad_client, conversation):
    task = _failed_search_task(conversation)
    failed = task.steps.get(position=2)
    response = dad_client.post(
        _actions(task, failed)["retry"],
        headers={"HX-Request": "true", "HX-Target": "timeline"},
    )
    body = response.content.decode()
    assert response.status_code == 200
    # The message goes out of band to the message region, which polls never replace.
    assert body.lstrip().startswith('<section id="timeline"')
    flash = body[body.index('<div id="messages"') :]
    assert 'hx-swap-oob="true"' in flash
    assert "Step 2 will run again." in flash
    assert "<html" not in body
    assert 'hx-trigger="every 2s"' in body  # queued again, so it polls


def test_retrying_a_done_step_is_refused_saying_where_it_stands(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    done = task.steps.get(position=1)
    response = dad_client.post(_actions(task, done)["retry"], follow=True)
    assert "Step 1 was already decided" in response.content.decode()
    assert "it is done now. Nothing was done twice." in response.content.decode()
    done.refresh_from_db()
    assert done.status == Step.Status.DONE


def test_resume_queues_a_paused_task_for_the_worker(dad_client, conversation):
    task = task_create(
        conversation=conversation,
        title="Later",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
        queue=False,
    )
    response = dad_client.post(_actions(task, task.steps.get())["resume"], follow=True)
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    assert "Queued “Later” for the worker." in response.content.decode()
    queued = Event.objects.filter(task=task, kind=Event.Kind.TASK_QUEUED).last()
    assert queued.data["actor"] == "user:dad"


def test_resume_of_a_task_blocked_by_a_failed_step_explains_why(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    response = dad_client.post(
        _actions(task, task.steps.get(position=2))["resume"], follow=True
    )
    assert (
        "Nothing was done: step 2 is failed and waits for your decision first"
        in response.content.decode()
    )
    task.refresh_from_db()
    assert task.status == Task.Status.FAILED


def test_resolving_a_failed_step_by_skipping_it_lets_the_task_finish(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    failed = task.steps.get(position=2)
    response = dad_client.post(
        _actions(task, failed)["resolve"], {"action": "skip"}, follow=True
    )
    assert "Step 2: skipped; the task goes on by itself." in response.content.decode()
    failed.refresh_from_db()
    assert failed.status == Step.Status.SKIPPED


def test_an_action_the_class_rules_forbid_is_refused_in_dads_words(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    failed = task.steps.get(position=2)
    response = dad_client.post(
        _actions(task, failed)["resolve"], {"action": "adopt"}, follow=True
    )
    body = response.content.decode()
    assert "Nothing was done: “Use the saved output” is not one of the ways" in body
    assert 'class="msg-error"' not in body  # news, in the page's normal colours
    assert "not allowed" not in body  # the service's words stay in the log
    failed.refresh_from_db()
    assert failed.status == Step.Status.FAILED


def test_a_decision_taken_in_another_window_is_told_as_such_and_not_done_twice(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    failed = task.steps.get(position=2)
    url = _actions(task, failed)["resolve"]
    dad_client.post(url, {"action": "skip"})
    events = task.events.count()
    response = dad_client.post(url, {"action": "skip"}, follow=True)
    body = response.content.decode()
    assert (
        "Step 2 was already decided, perhaps in another window: it is skipped now."
        " Nothing was done twice." in body
    )
    assert 'class="msg-info"' in body
    assert task.events.count() == events
    failed.refresh_from_db()
    assert failed.status == Step.Status.SKIPPED


def test_branch_asks_for_confirmation_then_opens_the_new_task(dad_client, conversation):
    task = _failed_search_task(conversation)
    url = _actions(task, task.steps.get(position=1))["branch"]
    confirm = dad_client.get(url, {"after_position": 1}).content.decode()
    assert "Branch “Search then chart” after step 1?" in confirm
    assert "It runs 1 step again: 2. Search the news" in confirm
    unconfirmed = dad_client.post(url, {"after_position": 1})
    assert unconfirmed.status_code == 302
    assert unconfirmed["Location"] == f"{url}?after_position=1"
    assert Task.objects.count() == 1
    response = dad_client.post(url, {"after_position": 1, "confirm": "yes"})
    branch = Task.objects.exclude(pk=task.pk).get()
    assert response.status_code == 302
    assert response["Location"] == branch.get_absolute_url()
    assert branch.branched_from_id == task.pk
    page = dad_client.get(branch.get_absolute_url()).content.decode()
    assert "Branched a new task that keeps steps 1–1." in page
    assert "keeping steps 1–1" in page


def test_branch_without_a_step_number_asks_for_one(dad_client, conversation):
    task = _failed_search_task(conversation)
    response = dad_client.post(
        _actions(task, task.steps.get(position=1))["branch"], {}, follow=True
    )
    assert "Choose a step to branch from." in response.content.decode()
    assert Task.objects.count() == 1


# -- who may act ----------------------------------------------------------------


def test_no_action_works_on_another_users_task(client, make_user, make_conversation):
    theirs = make_conversation(owner=make_user(username="neighbour"))
    task = _failed_search_task(theirs)
    failed = task.steps.get(position=2)
    client.force_login(make_user(username="nosy"))
    for name, url in _actions(task, failed).items():
        response = client.post(url, {"after_position": 1, "action": "skip"})
        assert response.status_code == 404, name
    failed.refresh_from_db()
    assert failed.status == Step.Status.FAILED
    assert Task.objects.count() == 1


def test_a_step_of_another_task_cannot_be_reached_through_my_task(
    dad_client, conversation, make_user, make_conversation
):
    mine = _failed_search_task(conversation)
    theirs = _failed_search_task(make_conversation(owner=make_user(username="x")))
    their_step = theirs.steps.get(position=2)
    url = reverse("dashboard:step_retry", args=[mine.pk, their_step.pk])
    assert dad_client.post(url).status_code == 404
    their_step.refresh_from_db()
    assert their_step.status == Step.Status.FAILED


def test_every_action_refuses_a_forged_post_without_a_csrf_token(user, conversation):
    task = _failed_search_task(conversation)
    failed = task.steps.get(position=2)
    forger = Client(enforce_csrf_checks=True)
    forger.force_login(user)
    for name, url in _actions(task, failed).items():
        response = forger.post(url, {"after_position": 1, "action": "skip"})
        assert response.status_code == 403, name
    failed.refresh_from_db()
    assert failed.status == Step.Status.FAILED
    assert Task.objects.count() == 1


def test_resume_refuses_get_and_the_other_actions_only_show_what_they_would_do(
    dad_client, conversation
):
    task = _failed_search_task(conversation)
    urls = _actions(task, task.steps.get(position=2))
    assert dad_client.get(urls["resume"]).status_code == 405
    for name, query in (
        ("branch", {"after_position": 1}),
        ("retry", {}),
        ("resolve", {"action": "skip"}),
    ):
        page = dad_client.get(urls[name], query)
        assert page.status_code == 200, name
        assert "What will happen" in page.content.decode()
    assert dad_client.get(urls["resolve"], {"action": "nonsense"}).status_code == 404
    task.refresh_from_db()
    assert task.status == Task.Status.FAILED
    assert Task.objects.count() == 1
    assert task.steps.get(position=2).generation == 0


def test_staff_retrying_their_own_step_are_named_in_the_event(
    client, make_user, make_conversation
):
    # Another user's step they cannot retry: tests/dashboard/test_staff_policy.py.
    boss = make_user(username="boss", is_staff=True)
    task = _failed_search_task(make_conversation(owner=boss))
    failed = task.steps.get(position=2)
    client.force_login(boss)
    assert client.post(_actions(task, failed)["retry"]).status_code == 302
    retried = Event.objects.get(task=task, kind=Event.Kind.STEP_RETRIED)
    assert retried.data["actor"] == "staff:boss"


def test_an_uncertain_step_with_outside_effects_warns_before_running_it_again(
    dad_client, conversation
):
    task = _crashed(conversation, "demo.notify", "after_started")
    notify = task.steps.get()
    body = dad_client.get(task.get_absolute_url()).content.decode()
    resolve = _actions(task, notify)["resolve"]
    # Sending again is a link to a confirmation page, never a one-click button.
    assert f'href="{resolve}?action=rerun">Run the same call again…</a>' in body
    assert 'value="rerun"' not in body
    assert "not every service does" in body
    confirm = dad_client.get(resolve, {"action": "rerun"}).content.decode()
    assert "acts outside Pippa (demo.notify)" in confirm
    assert "Careful:" in confirm
    unconfirmed = dad_client.post(resolve, {"action": "rerun"})
    assert unconfirmed["Location"] == f"{resolve}?action=rerun"
    notify.refresh_from_db()
    assert notify.status == Step.Status.RUNNING
    dad_client.post(resolve, {"action": "rerun", "confirm": "yes"})
    notify.refresh_from_db()
    assert notify.status == Step.Status.PENDING
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
