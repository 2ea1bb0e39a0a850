"""Repair actions in the admin: each calls its service, names the staff user in
the event it logs, and leaves the same state as calling the service directly."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from artifacts.models import Artifact, ArtifactClass
from artifacts.services import artifact_verify
from tasks import actions, crashpoints, executor
from tasks import admin as tasks_admin
from tasks.actions import (
    step_resolve,
    step_resolve_options,
    step_retry,
    task_branch,
    task_resume,
)
from tasks.crashpoints import SimulatedCrash
from tasks.lease import lease_release
from tasks.models import Event, Step, Task, TaskArtifact
from tasks.plan import task_create
from tasks.tools import ToolResult, tool_register
from tests.support.executing import boundary_of

pytestmark = pytest.mark.django_db

ACTOR = "staff:operator"
WORKER = "worker:host-1"


# -- tools for these tests ---------------------------------------------------------


def _quote(ctx, **args):
    """A live quote: a snapshot, never taken twice."""
    return ToolResult(data=b"quote: 101.25")


def _closes(ctx, **args):
    """Unadjusted closes for a fixed past range: safe to fetch again."""
    return ToolResult(data=b"date,close\n2025-01-02,100.0\n")


def _post(ctx, **args):
    """Posts to the family chat: outside effects."""
    return ToolResult(data=b"posted")


def _broken(ctx, **args):
    raise RuntimeError("the quote service is down")


tool_register("admintest_quote", _quote, artifact_class=ArtifactClass.SNAPSHOT)
tool_register("admintest_closes", _closes, artifact_class=ArtifactClass.FETCH)
tool_register("admintest_post", _post, side_effects=True)
tool_register("admintest_broken", _broken, artifact_class=ArtifactClass.FETCH)
tool_register("admintest_broken_post", _broken, side_effects=True)


@pytest.fixture(autouse=True)
def _no_crash_left_armed():
    yield
    crashpoints.disarm()


@pytest.fixture
def viewer_client(client, make_user):
    """Staff who may look at everything but change nothing."""
    viewer = make_user(username="viewer", is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__startswith="view_")
    )
    client.force_login(viewer)
    return client


def _plan(*tools: str, max_attempts: int = 3) -> list[dict]:
    return [
        {
            "title": f"step {n} ({t})",
            "tool": t,
            "args": {},
            "max_attempts": max_attempts,
        }
        for n, t in enumerate(tools, start=1)
    ]


def _crash_at(task: Task, boundary: str) -> None:
    """Run one step and die at ``boundary``, as a killed worker would
    (``after_payload``: as the three-commit executor did, see
    ``tests.support.executing.LEGACY_AFTER_PAYLOAD``)."""
    point, context = boundary_of(boundary)
    crashpoints.arm(point, action="raise")
    with context, pytest.raises(SimulatedCrash):
        executor.step(task_id=task.pk, worker_id=WORKER)
    crashpoints.disarm()


def _expire_lease(task: Task) -> None:
    Task.objects.filter(pk=task.pk).update(
        lease_expires_at=timezone.now() - timedelta(minutes=5)
    )


def _stale_task(make_conversation, *tools: str, boundary: str = "after_started"):
    task = task_create(
        conversation=make_conversation(), title="Quote and chart", steps=_plan(*tools)
    )
    _crash_at(task, boundary)
    _expire_lease(task)
    task.refresh_from_db()
    return task


def _state(task: Task) -> dict:
    """Everything a repair may change, without ids and times, for comparing."""
    task.refresh_from_db()
    steps = list(
        Step.objects.filter(task=task)
        .order_by("position")
        .values_list("status", "attempts", "generation", "output__sha256", "error")
    )
    events = [
        (e.kind, {k: v for k, v in e.data.items() if k not in {"until", "at"}})
        for e in Event.objects.filter(task=task).order_by("seq")
    ]
    return {
        "status": task.status,
        "lease_owner": task.lease_owner,
        "lease_expires_at": task.lease_expires_at,
        "steps_done": task.steps_done,
        "steps": steps,
        "events": events,
    }


def _normalise(state: dict, task: Task) -> dict:
    """Replace this task's own ids in event data so two twins compare equal."""
    ids = {task.pk: "TASK"} | {
        pk: f"STEP{pos}"
        for pk, pos in Step.objects.filter(task=task).values_list("pk", "position")
    }
    events = []
    for kind, data in state["events"]:
        data = {
            k: (ids.get(v, v) if k in {"step", "task", "key"} else v)
            for k, v in data.items()
        }
        data.pop("key", None)  # the idempotency key embeds the ids
        # Each twin's owner has its own row over the same bytes (compared by
        # sha in "steps"); the row ids differ.
        if "artifact_id" in data:
            data["artifact_id"] = "ARTIFACT"
        events.append((kind, data))
    return {**state, "events": events}


def _run_action(client, model_url: str, action: str, ids: list[int]):
    response = client.post(
        reverse(model_url), {"action": action, "_selected_action": ids}, follow=True
    )
    return response, [str(m) for m in get_messages(response.wsgi_request)]


def _last_event(task: Task, kind: str) -> Event:
    return Event.objects.filter(task=task, kind=kind).order_by("-seq").first()


# -- release a stale lease -----------------------------------------------------------


def test_releasing_a_stale_lease_frees_the_task_and_logs_the_staff_user(
    staff_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_quote")
    assert task.lease_owner == WORKER
    response, msgs = _run_action(
        staff_client, "admin:tasks_task_changelist", "release_stale_lease", [task.pk]
    )
    assert tasks_admin.MSG_LEASE_RELEASED.format(n=1) in msgs
    task.refresh_from_db()
    assert task.lease_owner == ""
    assert task.status == Task.Status.QUEUED
    event = _last_event(task, Event.Kind.LEASE_RELEASED)
    assert event.data["actor"] == ACTOR
    assert event.data["previous_owner"] == WORKER


def test_a_live_lease_is_not_released_from_the_admin(staff_client, make_conversation):
    task = task_create(
        conversation=make_conversation(), title="Busy", steps=_plan("admintest_quote")
    )
    _crash_at(task, "after_started")  # the worker's lease is still live
    before = _state(task)
    response, msgs = _run_action(
        staff_client, "admin:tasks_task_changelist", "release_stale_lease", [task.pk]
    )
    assert any("holds this task's lease" in m for m in msgs)
    assert _state(task) == before
    assert task.lease_owner == WORKER


def test_a_task_with_no_lease_is_left_alone(staff_client, make_task):
    task = make_task(title="Idle")
    response, msgs = _run_action(
        staff_client, "admin:tasks_task_changelist", "release_stale_lease", [task.pk]
    )
    assert tasks_admin.MSG_LEASE_NOT_STALE.format(n=1) in msgs
    assert not Event.objects.filter(task=task).exists()


def test_releasing_from_the_admin_equals_calling_lease_release(
    staff_client, make_conversation
):
    by_admin = _stale_task(make_conversation, "admintest_quote", "admintest_closes")
    by_service = _stale_task(make_conversation, "admintest_quote", "admintest_closes")
    _run_action(
        staff_client,
        "admin:tasks_task_changelist",
        "release_stale_lease",
        [by_admin.pk],
    )
    assert lease_release(task=by_service, actor=ACTOR) is True
    assert _normalise(_state(by_admin), by_admin) == _normalise(
        _state(by_service), by_service
    )


def test_staff_who_may_only_view_cannot_release_a_lease(
    viewer_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_quote")
    listing = viewer_client.get(reverse("admin:tasks_task_changelist"))
    assert listing.status_code == 200
    assert b"release_stale_lease" not in listing.content
    viewer_client.post(
        reverse("admin:tasks_task_changelist"),
        {"action": "release_stale_lease", "_selected_action": [task.pk]},
    )
    task.refresh_from_db()
    assert task.lease_owner == WORKER


# -- resume ----------------------------------------------------------------------------


def test_resuming_a_paused_task_queues_it_and_logs_the_staff_user(
    staff_client, make_conversation
):
    task = task_create(
        conversation=make_conversation(),
        title="Later",
        steps=_plan("admintest_quote"),
        queue=False,
    )
    _, msgs = _run_action(
        staff_client, "admin:tasks_task_changelist", "resume_tasks", [task.pk]
    )
    assert tasks_admin.MSG_RESUMED.format(n=1) in msgs
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED
    assert _last_event(task, Event.Kind.TASK_QUEUED).data["actor"] == ACTOR


def test_resuming_a_done_task_is_refused_with_the_services_reason(
    staff_client, make_conversation
):
    task = task_create(
        conversation=make_conversation(), title="Done", steps=_plan("admintest_quote")
    )
    executor.step(task_id=task.pk, worker_id=WORKER)
    executor.step(task_id=task.pk, worker_id=WORKER)
    task.refresh_from_db()
    assert task.status == Task.Status.DONE
    before = _state(task)
    _, msgs = _run_action(
        staff_client, "admin:tasks_task_changelist", "resume_tasks", [task.pk]
    )
    assert f"Task {task.pk}: {actions.ERR_TASK_DONE}" in msgs
    assert _state(task) == before


def test_resuming_from_the_admin_equals_calling_task_resume(
    staff_client, make_conversation
):
    twins = [
        _stale_task(make_conversation, "admintest_quote", "admintest_closes")
        for _ in range(2)
    ]
    _run_action(
        staff_client, "admin:tasks_task_changelist", "resume_tasks", [twins[0].pk]
    )
    task_resume(task=twins[1], actor=ACTOR)
    assert _normalise(_state(twins[0]), twins[0]) == _normalise(
        _state(twins[1]), twins[1]
    )


# -- resolve an uncertain or needs-review step -----------------------------------------


def _resolve_url(step: Step) -> str:
    return reverse("admin:tasks_step_resolve", args=[step.pk])


def test_the_resolve_page_offers_only_what_the_class_rules_allow_and_says_what_happens(
    staff_client, make_conversation
):
    # A snapshot whose payload was persisted before the worker died: adopt it,
    # never take it twice.
    task = _stale_task(make_conversation, "admintest_quote", boundary="after_payload")
    step = task.steps.get(position=1)
    allowed = step_resolve_options(step)
    assert "adopt" in allowed
    assert "rerun" not in allowed
    body = staff_client.get(_resolve_url(step)).content.decode()
    for action in allowed:
        assert f'value="{action}"' in body
        assert escape(tasks_admin.RESOLVE_WORDS[action]) in body
    assert 'value="rerun"' not in body
    assert "Do this" in body


def test_the_admin_names_a_steps_choices_as_the_dashboard_does(
    staff_client, make_conversation
):
    import re

    task = _stale_task(make_conversation, "admintest_quote", boundary="after_payload")
    step = task.steps.get(position=1)
    admin_page = staff_client.get(_resolve_url(step)).content.decode()
    admin_names = re.findall(
        r'<label for="resolve-(\w+)" class="vCheckboxLabel"><strong>([^<]+)</strong>',
        admin_page,
    )
    # The owner's page: staff read another's task there but choose in the admin.
    owner = Client()
    owner.force_login(task.conversation.owner)
    dashboard = owner.get(task.get_absolute_url()).content.decode()
    assert admin_names
    for action, name in admin_names:
        assert re.search(
            rf'id="choose-{step.pk}-{action}"[^>]*>{re.escape(name)}(…)?<', dashboard
        ), (action, name)
    # The list action for starting a step over is the dashboard's words too.
    retry = tasks_admin.StepAdmin.retry_steps
    assert retry.short_description == "Start selected steps over"


def test_adopting_the_persisted_payload_finishes_the_step_without_calling_the_tool(
    staff_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_quote", boundary="after_payload")
    step = task.steps.get(position=1)
    persisted = _last_event(task, Event.Kind.PAYLOAD_PERSISTED).data
    response = staff_client.post(_resolve_url(step), {"action": "adopt"}, follow=True)
    msgs = [str(m) for m in get_messages(response.wsgi_request)]
    assert (
        tasks_admin.MSG_RESOLVED.format(
            step=step.pk, words=tasks_admin.RESOLVE_LABELS["adopt"]
        )
        in msgs
    )
    step.refresh_from_db()
    assert step.status == Step.Status.DONE
    assert step.output.sha256 == persisted["sha"]
    assert step.attempts == 1
    resolved = _last_event(task, Event.Kind.STEP_RESOLVED)
    assert resolved.data["actor"] == ACTOR
    assert resolved.data["action"] == "adopt"
    assert Event.objects.filter(task=task, kind="tool_call_started").count() == 1


def test_an_action_the_class_rules_forbid_is_refused_even_when_posted(
    staff_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_quote", boundary="after_payload")
    step = task.steps.get(position=1)
    before = _state(task)
    response = staff_client.post(_resolve_url(step), {"action": "rerun"}, follow=True)
    msgs = [str(m) for m in get_messages(response.wsgi_request)]
    assert tasks_admin.MSG_NOT_OFFERED in msgs
    assert _state(task) == before


def test_a_step_under_a_live_lease_has_nothing_to_resolve(
    staff_client, make_conversation
):
    task = task_create(
        conversation=make_conversation(), title="Busy", steps=_plan("admintest_quote")
    )
    _crash_at(task, "after_payload")  # lease still live: the worker may be alive
    step = task.steps.get(position=1)
    body = staff_client.get(_resolve_url(step)).content.decode()
    assert "has nothing to resolve" in body
    assert 'name="action"' not in body
    before = _state(task)
    staff_client.post(_resolve_url(step), {"action": "adopt"})
    assert _state(task) == before


def test_a_step_with_outside_effects_goes_to_review_and_can_be_skipped(
    staff_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_post", "admintest_quote")
    executor.step(task_id=task.pk, worker_id="worker:host-2")  # resume: needs review
    step = task.steps.get(position=1)
    step.refresh_from_db()
    assert step.status == Step.Status.NEEDS_REVIEW
    listing = staff_client.get(
        reverse("admin:tasks_step_changelist") + "?needs_review=yes"
    )
    assert _resolve_url(step) in listing.content.decode()
    assert "skip" in step_resolve_options(step)
    page = staff_client.get(_resolve_url(step)).content.decode()
    assert escape(tasks_admin.RERUN_OUTSIDE_EFFECTS.strip()) in page
    staff_client.post(_resolve_url(step), {"action": "skip"})
    step.refresh_from_db()
    assert step.status == Step.Status.SKIPPED
    assert _last_event(task, Event.Kind.STEP_SKIPPED).data["actor"] == ACTOR


@pytest.mark.parametrize("action", ["adopt", "fail", "skip"])
def test_resolving_from_the_admin_equals_calling_step_resolve(
    staff_client, make_conversation, action
):
    twins = [
        _stale_task(
            make_conversation,
            "admintest_quote",
            "admintest_closes",
            boundary="after_payload",
        )
        for _ in range(2)
    ]
    by_admin, by_service = (t.steps.get(position=1) for t in twins)
    staff_client.post(_resolve_url(by_admin), {"action": action})
    step_resolve(step=by_service, action=action, actor=ACTOR)
    assert _normalise(_state(twins[0]), twins[0]) == _normalise(
        _state(twins[1]), twins[1]
    )


def test_the_resolve_action_on_the_step_list_opens_the_confirmation_page(
    staff_client, make_conversation
):
    task = _stale_task(
        make_conversation,
        "admintest_quote",
        "admintest_closes",
        boundary="after_payload",
    )
    step, other = task.steps.order_by("position")
    response = staff_client.post(
        reverse("admin:tasks_step_changelist"),
        {"action": "resolve_step", "_selected_action": [step.pk]},
    )
    assert response.status_code == 302
    assert response["Location"] == _resolve_url(step)
    two = staff_client.post(
        reverse("admin:tasks_step_changelist"),
        {"action": "resolve_step", "_selected_action": [step.pk, other.pk]},
        follow=True,
    )
    msgs = [str(m) for m in get_messages(two.wsgi_request)]
    assert tasks_admin.MSG_ONE_AT_A_TIME.format(what="step") in msgs


def test_staff_who_may_only_view_cannot_open_or_post_the_resolve_page(
    viewer_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_quote", boundary="after_payload")
    step = task.steps.get(position=1)
    assert viewer_client.get(_resolve_url(step)).status_code == 403
    assert (
        viewer_client.post(_resolve_url(step), {"action": "adopt"}).status_code == 403
    )
    step.refresh_from_db()
    assert step.status == Step.Status.RUNNING


# -- retry ------------------------------------------------------------------------------


def _failed_task(make_conversation):
    task = task_create(
        conversation=make_conversation(),
        title="Flaky",
        steps=_plan("admintest_broken", "admintest_quote", max_attempts=1),
    )
    executor.step(task_id=task.pk, worker_id=WORKER)
    step = task.steps.get(position=1)
    assert step.status == Step.Status.FAILED
    return task, step


def test_retrying_a_failed_step_makes_it_pending_again_and_logs_the_staff_user(
    staff_client, make_conversation
):
    task, step = _failed_task(make_conversation)
    _, msgs = _run_action(
        staff_client, "admin:tasks_step_changelist", "retry_steps", [step.pk]
    )
    assert tasks_admin.MSG_RETRIED.format(step=step.pk) in msgs
    step.refresh_from_db()
    assert step.status == Step.Status.PENDING
    assert step.generation == 1
    assert _last_event(task, Event.Kind.STEP_RETRIED).data["actor"] == ACTOR


def test_retrying_a_done_step_is_refused_with_the_services_reason(
    staff_client, make_conversation
):
    task = task_create(
        conversation=make_conversation(), title="Fine", steps=_plan("admintest_quote")
    )
    executor.step(task_id=task.pk, worker_id=WORKER)
    step = task.steps.get(position=1)
    before = _state(task)
    _, msgs = _run_action(
        staff_client, "admin:tasks_step_changelist", "retry_steps", [step.pk]
    )
    expected = actions.ERR_NOT_RETRYABLE.format(position=1, status="done")
    assert f"Step {step.pk}: {expected}" in msgs
    assert _state(task) == before


def test_starting_an_outside_effect_step_over_asks_first_and_changes_nothing_until_then(
    staff_client, make_conversation
):
    task = task_create(
        conversation=make_conversation(),
        title="Send the note",
        steps=_plan("admintest_broken_post", max_attempts=1),
    )
    executor.step(task_id=task.pk, worker_id=WORKER)
    step = task.steps.get(position=1)
    assert step.status == Step.Status.FAILED
    before = _state(task)
    response = staff_client.post(
        reverse("admin:tasks_step_changelist"),
        {"action": "retry_steps", "_selected_action": [step.pk]},
    )
    assert response.status_code == 200
    assert b"does it again" in response.content
    assert b"step 1 (admintest_broken_post)" in response.content
    assert _state(task) == before  # nothing happened yet

    response = staff_client.post(
        reverse("admin:tasks_step_changelist"),
        {"action": "retry_steps", "_selected_action": [step.pk], "confirm": "yes"},
        follow=True,
    )
    assert tasks_admin.MSG_RETRIED.format(step=step.pk) in [
        str(m) for m in get_messages(response.wsgi_request)
    ]
    step.refresh_from_db()
    assert step.status == Step.Status.PENDING
    assert step.generation == 1


def test_retrying_from_the_admin_equals_calling_step_retry(
    staff_client, make_conversation
):
    (a, a_step), (b, b_step) = (_failed_task(make_conversation) for _ in range(2))
    _run_action(staff_client, "admin:tasks_step_changelist", "retry_steps", [a_step.pk])
    step_retry(step=b_step, actor=ACTOR)
    assert _normalise(_state(a), a) == _normalise(_state(b), b)


# -- branch -----------------------------------------------------------------------------


def _done_task(make_conversation):
    task = task_create(
        conversation=make_conversation(),
        title="Three steps",
        steps=_plan("admintest_quote", "admintest_closes", "admintest_quote"),
    )
    for _ in range(4):
        executor.step(task_id=task.pk, worker_id=WORKER)
    task.refresh_from_db()
    assert task.status == Task.Status.DONE
    return task


def test_branching_keeps_steps_one_to_k_and_logs_the_staff_user_on_both_tasks(
    staff_client, make_conversation
):
    task = _done_task(make_conversation)
    url = reverse("admin:tasks_task_branch", args=[task.pk])
    page = staff_client.get(url).content.decode()
    assert "keeps steps 1 to k" in page
    assert 'value="2"' in page
    response = staff_client.post(url, {"after_position": "2"})
    branch = Task.objects.get(branched_from=task)
    assert response["Location"] == reverse("admin:tasks_task_change", args=[branch.pk])
    assert branch.branched_at == 2
    kept = list(branch.steps.order_by("position").values_list("status", "output_id"))
    original = list(task.steps.order_by("position").values_list("output_id", flat=True))
    assert kept[:2] == [("done", original[0]), ("done", original[1])]
    assert kept[2] == ("pending", None)
    assert _last_event(task, Event.Kind.TASK_BRANCHED).data["actor"] == ACTOR
    assert _last_event(branch, Event.Kind.TASK_BRANCHED).data["actor"] == ACTOR


def test_branching_after_an_unfinished_step_is_refused(staff_client, make_conversation):
    task, _ = _failed_task(make_conversation)
    page = staff_client.get(reverse("admin:tasks_task_branch", args=[task.pk]))
    offered = [k for k, _label, _kept in page.context["choices"]]
    assert offered == [0]
    response = staff_client.post(
        reverse("admin:tasks_task_branch", args=[task.pk]),
        {"after_position": "1"},
        follow=True,
    )
    msgs = [str(m) for m in get_messages(response.wsgi_request)]
    expected = actions.ERR_BRANCH_UNFINISHED.format(position=1, status="failed")
    assert f"Task {task.pk}: {expected}" in msgs
    assert not Task.objects.filter(branched_from=task).exists()


def test_branching_from_the_admin_equals_calling_task_branch(
    staff_client, make_conversation
):
    a, b = _done_task(make_conversation), _done_task(make_conversation)
    staff_client.post(
        reverse("admin:tasks_task_branch", args=[a.pk]), {"after_position": "1"}
    )
    task_branch(task=b, after_position=1, actor=ACTOR)
    a_branch = Task.objects.get(branched_from=a)
    b_branch = Task.objects.get(branched_from=b)
    a_state, b_state = _state(a_branch), _state(b_branch)
    for state in (a_state, b_state):
        state["events"] = [
            (k, {x: y for x, y in d.items() if x not in {"branched_from", "title"}})
            for k, d in state["events"]
        ]
    assert a_state == b_state


def test_staff_who_may_only_view_cannot_branch(viewer_client, make_conversation):
    task = _done_task(make_conversation)
    url = reverse("admin:tasks_task_branch", args=[task.pk])
    assert viewer_client.post(url, {"after_position": "1"}).status_code == 403
    assert not Task.objects.filter(branched_from=task).exists()


# -- verify artifacts -------------------------------------------------------------------


def _kept_artifact(make_task, make_artifact, **kwargs):
    task = make_task(title="Keeps it")
    artifact = make_artifact(**kwargs)
    TaskArtifact.objects.create(task=task, artifact=artifact)
    return task, artifact


def test_verifying_marks_a_corrupt_blob_damaged_and_logs_the_staff_user(
    staff_client, make_task, make_artifact, blob_store
):
    task, artifact = _kept_artifact(make_task, make_artifact)
    _, intact = _kept_artifact(make_task, make_artifact)
    blob_store.path(artifact.sha256).write_bytes(b"bit rot")
    _, msgs = _run_action(
        staff_client,
        "admin:artifacts_artifact_changelist",
        "verify_artifacts",
        [artifact.pk, intact.pk],
    )
    assert "Verified 2 artifact(s): 1 intact, 0 missing, 1 corrupt." in msgs
    artifact.refresh_from_db()
    assert artifact.integrity == Artifact.Integrity.CORRUPT
    event = _last_event(task, Event.Kind.ADMIN_ACTION)
    assert event.data == {
        "action": "artifact_verify",
        "actor": ACTOR,
        "artifact_id": artifact.pk,
        "integrity": "corrupt",
    }
    damaged = staff_client.get(
        reverse("admin:artifacts_artifact_changelist") + "?integrity__exact=corrupt"
    )
    assert list(damaged.context["cl"].result_list) == [artifact]


def test_verifying_from_the_admin_equals_calling_artifact_verify(
    staff_client, make_task, make_artifact, blob_store
):
    _, by_admin = _kept_artifact(make_task, make_artifact)
    _, by_service = _kept_artifact(make_task, make_artifact)
    for artifact in (by_admin, by_service):
        blob_store.path(artifact.sha256).unlink()
    _run_action(
        staff_client,
        "admin:artifacts_artifact_changelist",
        "verify_artifacts",
        [by_admin.pk],
    )
    assert artifact_verify(artifact=by_service) == Artifact.Integrity.MISSING
    by_admin.refresh_from_db()
    by_service.refresh_from_db()
    assert by_admin.integrity == by_service.integrity == Artifact.Integrity.MISSING


def test_staff_who_may_only_view_cannot_verify(viewer_client, make_artifact):
    artifact = make_artifact()
    Artifact.objects.filter(pk=artifact.pk).update(integrity="unchecked")
    listing = viewer_client.get(reverse("admin:artifacts_artifact_changelist"))
    assert b"verify_artifacts" not in listing.content
    viewer_client.post(
        reverse("admin:artifacts_artifact_changelist"),
        {"action": "verify_artifacts", "_selected_action": [artifact.pk]},
    )
    artifact.refresh_from_db()
    assert artifact.integrity == "unchecked"


# -- re-render a widget's preview ---------------------------------------------------------

SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20">'
    b'<rect width="40" height="20" fill="#36c"/></svg>'
)


def test_rerendering_a_widget_preview_stores_the_png_and_logs_the_staff_user(
    staff_client, make_task, make_artifact
):
    task, widget = _kept_artifact(
        make_task,
        make_artifact,
        data=SVG,
        media_type="image/svg+xml",
        artifact_class=ArtifactClass.RENDER,
        title="bar chart",
    )
    _, msgs = _run_action(
        staff_client,
        "admin:artifacts_artifact_changelist",
        "rerender_previews",
        [widget.pk],
    )
    widget.refresh_from_db()
    preview_id = widget.meta["preview"]["artifact_id"]
    assert (
        f"Rendered the preview of artifact {widget.pk} (artifact {preview_id})." in msgs
    )
    preview = Artifact.objects.get(pk=preview_id)
    assert preview.media_type == "image/png"
    assert list(preview.sources.all()) == [widget]
    event = _last_event(task, Event.Kind.ADMIN_ACTION)
    assert event.data["actor"] == ACTOR
    assert event.data["action"] == "preview_render"
    assert event.data["preview_id"] == preview_id
    page = staff_client.get(
        reverse("admin:artifacts_artifact_change", args=[widget.pk])
    ).content.decode()
    assert f'src="{reverse("artifacts:preview", args=[widget.pk])}"' in page


def test_rerendering_something_that_is_not_a_widget_is_refused(
    staff_client, make_task, make_artifact
):
    task, artifact = _kept_artifact(make_task, make_artifact)
    _, msgs = _run_action(
        staff_client,
        "admin:artifacts_artifact_changelist",
        "rerender_previews",
        [artifact.pk],
    )
    assert (
        f"Artifact {artifact.pk} is not a widget (SVG or HTML): it has no preview."
        in msgs
    )
    assert not Event.objects.filter(task=task, kind=Event.Kind.ADMIN_ACTION).exists()
    assert Artifact.objects.count() == 1


def test_a_widget_that_cannot_render_is_reported_and_logged(
    staff_client, make_task, make_artifact
):
    task, widget = _kept_artifact(
        make_task,
        make_artifact,
        data=b"<svg xmlns='http://www.w3.org/2000/svg'><unclosed></svg>",
        media_type="image/svg+xml",
        artifact_class=ArtifactClass.RENDER,
    )
    _, msgs = _run_action(
        staff_client,
        "admin:artifacts_artifact_changelist",
        "rerender_previews",
        [widget.pk],
    )
    assert any(
        m.startswith(f"Could not render the preview of artifact {widget.pk}:")
        for m in msgs
    )
    event = _last_event(task, Event.Kind.ADMIN_ACTION)
    assert event.data["preview"] == "failed"
    assert event.data["actor"] == ACTOR
    page = staff_client.get(
        reverse("admin:artifacts_artifact_change", args=[widget.pk])
    ).content.decode()
    assert "failed: " in page


# -- the doctor ---------------------------------------------------------------------------

DOCTOR = "admin:tasks_doctor"


def test_the_doctor_page_shows_the_same_findings_as_running_the_doctor(
    staff_client, make_conversation
):
    from tasks.doctor import doctor_run

    _stale_task(make_conversation, "admintest_quote")
    direct = doctor_run(repair=False)
    response = staff_client.get(reverse(DOCTOR))
    assert response.status_code == 200
    shown = response.context["report"]
    assert [(f.key, f.found) for f in shown.findings] == [
        (f.key, f.found) for f in direct.findings
    ]
    assert shown.finding("expired_leases").found == 1
    body = response.content.decode()
    assert "Task leases past expiry" in body
    assert "Repair what can be repaired" in body


def test_repairing_from_the_doctor_page_releases_the_lease_and_names_the_staff_user(
    staff_client, make_conversation
):
    from tasks.doctor import doctor_run

    task = _stale_task(make_conversation, "admintest_quote")
    response = staff_client.post(reverse(DOCTOR), follow=True)
    report = response.context["report"]
    assert report.finding("expired_leases").repaired == 1
    assert report.finding("expired_leases").remaining == 0
    msgs = [str(m) for m in get_messages(response.wsgi_request)]
    assert any(m.startswith("The doctor repaired ") for m in msgs)
    task.refresh_from_db()
    assert task.lease_owner == ""
    assert _last_event(task, Event.Kind.LEASE_RELEASED).data["actor"] == "doctor"
    assert _last_event(task, Event.Kind.ADMIN_ACTION).data == {
        "action": "doctor_repair",
        "actor": ACTOR,
    }
    assert doctor_run(repair=False).finding("expired_leases").found == 0


def test_a_clean_database_gets_an_all_clear_and_no_repair_button(staff_client):
    body = staff_client.get(reverse(DOCTOR)).content.decode()
    assert "All clear: nothing to repair." in body
    assert "Repair what can be repaired" not in body


def test_staff_who_may_only_view_see_the_report_but_cannot_repair(
    viewer_client, make_conversation
):
    task = _stale_task(make_conversation, "admintest_quote")
    page = viewer_client.get(reverse(DOCTOR))
    assert page.status_code == 200
    assert b"Repair what can be repaired" not in page.content
    assert viewer_client.post(reverse(DOCTOR)).status_code == 403
    task.refresh_from_db()
    assert task.lease_owner == WORKER


def test_the_task_list_links_to_the_doctor(staff_client):
    body = staff_client.get(reverse("admin:tasks_task_changelist")).content.decode()
    assert reverse(DOCTOR) in body
    assert "Run the doctor" in body


def test_rerendering_from_the_admin_equals_calling_preview_render(
    staff_client, make_task, make_artifact
):
    from artifacts.preview import preview_render

    widgets = [
        _kept_artifact(
            make_task,
            make_artifact,
            data=SVG.replace(b"#36c", colour),
            media_type="image/svg+xml",
            artifact_class=ArtifactClass.RENDER,
            title="bar chart",
        )[1]
        for colour in (b"#36c", b"#c63")
    ]
    by_admin, by_service = widgets
    _run_action(
        staff_client,
        "admin:artifacts_artifact_changelist",
        "rerender_previews",
        [by_admin.pk],
    )
    direct = preview_render(artifact=by_service)
    by_admin.refresh_from_db()
    by_service.refresh_from_db()
    via_admin = Artifact.objects.get(pk=by_admin.meta["preview"]["artifact_id"])
    assert by_admin.meta["preview"]["status"] == by_service.meta["preview"]["status"]
    assert direct.pk == by_service.meta["preview"]["artifact_id"]
    for preview, widget in ((via_admin, by_admin), (direct, by_service)):
        assert preview.media_type == "image/png"
        assert preview.artifact_class == ArtifactClass.RENDER
        assert list(preview.sources.all()) == [widget]
