"""The admin pages: who gets in, what each list shows, and what stays read-only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from artifacts.models import Artifact, ArtifactClass
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from tasks.models import Event, Step, Task, TaskArtifact
from tasks.services import event_append

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(make_task, make_artifact):
    """One of everything: a task with steps, events, links, artifacts, a round."""
    task = make_task(title="Chart the closes", brain="claude")
    output = make_artifact(title="closes.csv", artifact_class=ArtifactClass.FETCH)
    done = Step.objects.create(
        task=task,
        position=1,
        title="Fetch closes",
        tool="fetch_closes",
        artifact_class=ArtifactClass.FETCH,
        status=Step.Status.DONE,
        output=output,
        attempts=1,
    )
    review = Step.objects.create(
        task=task,
        position=2,
        title="Post the chart",
        tool="post_chart",
        status=Step.Status.NEEDS_REVIEW,
        side_effects=True,
        attempts=1,
    )
    TaskArtifact.objects.create(task=task, step=done, artifact=output)
    event = event_append(
        task_id=task.pk, step_id=done.pk, kind="tool_call_started", data={"n": 1}
    )
    rnd = CouncilRound.objects.create(
        conversation=task.conversation, number=1, topic="Which chart?"
    )
    speaker = Participant.objects.create(round=rnd, name="kimi", brain="kimi")
    turn = Turn.objects.create(round=rnd, participant=speaker, order=1, text="A bar.")
    widget = make_artifact(
        data=b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        media_type="image/svg+xml",
        artifact_class=ArtifactClass.RENDER,
        title="bar widget",
    )
    TurnArtifact.objects.create(turn=turn, artifact=widget)
    return {
        "task": task,
        "done": done,
        "review": review,
        "event": event,
        "output": output,
        "round": rnd,
        "participant": speaker,
        "turn": turn,
        "widget": widget,
        "conversation": task.conversation,
    }


def _changelist(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def _change(obj) -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])


def _delete(obj) -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_delete", args=[obj.pk])


# -- who gets in ------------------------------------------------------------------


def test_an_anonymous_visitor_is_sent_to_the_admin_login(client):
    response = client.get("/admin/tasks/task/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_a_signed_in_user_who_is_not_staff_is_refused_the_admin(client, make_user):
    client.force_login(make_user(username="dad"))
    for url in ["/admin/", "/admin/tasks/task/", "/admin/tasks/task/doctor/"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/")
    page = client.get("/admin/login/?next=/admin/")
    assert b"not authorized to access this page" in page.content


def test_staff_see_every_pippa_model_on_the_admin_index(staff_client):
    response = staff_client.get("/admin/")
    assert response.status_code == 200
    for name in [
        b"Conversations",
        b"Tasks",
        b"Steps",
        b"Events",
        b"Task artifacts",
        b"Artifacts",
        b"Council rounds",
        b"Participants",
        b"Turns",
    ]:
        assert name in response.content, name


def test_the_admin_index_points_the_operator_at_what_needs_repair(staff_client):
    body = staff_client.get("/admin/").content.decode()
    for url in [
        reverse("admin:tasks_task_changelist") + "?lease_expired=yes",
        reverse("admin:tasks_step_changelist") + "?needs_review=yes",
        reverse("admin:artifacts_artifact_changelist") + "?integrity__exact=corrupt",
        reverse("admin:tasks_doctor"),
    ]:
        assert f'href="{url}"' in body, url


def test_every_list_and_change_page_renders_for_staff(staff_client, world):
    objects = [
        world["conversation"],
        world["task"],
        world["done"],
        world["review"],
        world["event"],
        TaskArtifact.objects.get(),
        world["output"],
        world["widget"],
        world["round"],
        world["participant"],
        world["turn"],
    ]
    for obj in objects:
        listing = staff_client.get(_changelist(type(obj)))
        assert listing.status_code == 200, type(obj)
        page = staff_client.get(_change(obj))
        assert page.status_code == 200, obj
        assert "Content-Security-Policy" in page


# -- list columns, filters, search -------------------------------------------------


def test_the_task_list_shows_status_brain_progress_and_a_stale_lease(
    staff_client, world
):
    task = world["task"]
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner="worker:host-1",
        lease_expires_at=timezone.now() - timedelta(minutes=5),
        steps_total=2,
        steps_done=1,
    )
    response = staff_client.get(_changelist(Task))
    body = response.content.decode()
    assert "Chart the closes" in body
    assert "claude" in body
    assert "1/2" in body
    assert "<strong>stale</strong> worker:host-1" in body


def test_the_lease_expired_filter_lists_only_tasks_whose_worker_is_gone(
    staff_client, make_task
):
    now = timezone.now()
    make_task(
        title="stale one",
        status=Task.Status.RUNNING,
        lease_owner="worker:a",
        lease_expires_at=now - timedelta(seconds=30),
    )
    make_task(
        title="live one",
        status=Task.Status.RUNNING,
        lease_owner="worker:b",
        lease_expires_at=now + timedelta(minutes=5),
    )
    make_task(title="idle one")
    stale = staff_client.get(_changelist(Task) + "?lease_expired=yes").content
    assert b"stale one" in stale
    assert b"live one" not in stale
    assert b"idle one" not in stale
    rest = staff_client.get(_changelist(Task) + "?lease_expired=no").content
    assert b"stale one" not in rest
    assert b"live one" in rest
    assert b"idle one" in rest


def test_tasks_filter_by_status_and_brain_and_search_by_title(staff_client, make_task):
    make_task(title="Claude task", brain="claude", status=Task.Status.FAILED)
    make_task(title="Codex task", brain="codex")
    by_brain = staff_client.get(_changelist(Task) + "?brain=codex").content
    assert b"Codex task" in by_brain
    assert b"Claude task" not in by_brain
    by_status = staff_client.get(_changelist(Task) + "?status__exact=failed").content
    assert b"Claude task" in by_status
    assert b"Codex task" not in by_status
    found = staff_client.get(_changelist(Task) + "?q=codex").content
    assert b"Codex task" in found
    assert b"Claude task" not in found


def test_the_needs_review_filter_lists_only_steps_waiting_for_a_person(
    staff_client, world
):
    response = staff_client.get(_changelist(Step) + "?needs_review=yes")
    body = response.content.decode()
    assert "Post the chart" in body
    assert "Fetch closes" not in body
    assert reverse("admin:tasks_step_resolve", args=[world["review"].pk]) in body


def test_the_stuck_filter_lists_running_steps_whose_task_lease_is_stale(
    staff_client, make_task
):
    stale = make_task(
        title="dead worker",
        status=Task.Status.RUNNING,
        lease_owner="worker:gone",
        lease_expires_at=timezone.now() - timedelta(minutes=1),
    )
    live = make_task(
        title="live worker",
        status=Task.Status.RUNNING,
        lease_owner="worker:here",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
    )
    Step.objects.create(
        task=stale, position=1, title="stuck", tool="t", status="running"
    )
    Step.objects.create(
        task=live, position=1, title="moving", tool="t", status="running"
    )
    body = staff_client.get(_changelist(Step) + "?needs_review=stuck").content
    assert b"stuck" in body
    assert b"moving" not in body


def test_artifacts_filter_by_class_and_integrity_and_search_by_sha_prefix(
    staff_client, world
):
    output, widget = world["output"], world["widget"]
    Artifact.objects.filter(pk=widget.pk).update(integrity=Artifact.Integrity.CORRUPT)
    by_class = staff_client.get(_changelist(Artifact) + "?artifact_class__exact=4")
    assert b"bar widget" in by_class.content
    assert b"closes.csv" not in by_class.content
    damaged = staff_client.get(_changelist(Artifact) + "?integrity__exact=corrupt")
    assert b"bar widget" in damaged.content
    assert b"closes.csv" not in damaged.content
    by_sha = staff_client.get(_changelist(Artifact) + f"?q={output.sha256[:10]}")
    assert b"closes.csv" in by_sha.content
    assert b"bar widget" not in by_sha.content
    # A prefix, not a substring: the sha's middle finds nothing.
    middle = staff_client.get(_changelist(Artifact) + f"?q={output.sha256[20:34]}")
    assert b"closes.csv" not in middle.content


def test_participants_and_rounds_filter_by_brain(staff_client, world):
    other = Participant.objects.create(round=world["round"], name="grok", brain="grok")
    listing = staff_client.get(_changelist(Participant) + "?brain=kimi")
    assert list(listing.context["cl"].result_list) == [world["participant"]]
    assert other not in listing.context["cl"].result_list
    rounds = staff_client.get(
        _changelist(CouncilRound) + "?participants__brain=kimi"
    ).content
    assert b"Which chart?" in rounds


def test_the_task_page_lists_its_steps_inline_without_edit_or_delete(
    staff_client, world
):
    body = staff_client.get(_change(world["task"])).content.decode()
    assert "Fetch closes" in body
    assert "Post the chart" in body
    assert 'name="steps-0-status"' not in body
    assert "steps-0-DELETE" not in body
    assert reverse("admin:tasks_step_resolve", args=[world["review"].pk]) in body
    assert reverse("admin:tasks_task_branch", args=[world["task"].pk]) in body
    assert "State (read-only: changed only through the actions)" in body


# -- read-only rules ----------------------------------------------------------------


def test_a_task_form_changes_its_title_but_never_its_status_or_lease(
    staff_client, world
):
    task = world["task"]
    expires = timezone.now() - timedelta(minutes=3)
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING, lease_owner="worker:x", lease_expires_at=expires
    )
    response = staff_client.post(
        _change(task),
        {
            "title": "Renamed",
            "status": "done",
            "lease_owner": "",
            "lease_expires_at": "",
            "brain": "grok",
            "steps-TOTAL_FORMS": "2",
            "steps-INITIAL_FORMS": "2",
            "steps-MIN_NUM_FORMS": "0",
            "steps-MAX_NUM_FORMS": "1000",
            "steps-0-id": str(world["done"].pk),
            "steps-0-task": str(task.pk),
            "steps-0-status": "pending",
            "steps-1-id": str(world["review"].pk),
            "steps-1-task": str(task.pk),
            "steps-1-status": "done",
        },
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.title == "Renamed"
    assert task.status == Task.Status.RUNNING
    assert task.lease_owner == "worker:x"
    assert task.lease_expires_at == expires
    assert task.brain == "claude"
    statuses = dict(Step.objects.values_list("position", "status"))
    assert statuses == {1: "done", 2: "needs_review"}


def test_a_step_form_has_no_editable_state(staff_client, world):
    step = world["review"]
    body = staff_client.get(_change(step)).content.decode()
    for field in ["status", "attempts", "output", "max_attempts", "args", "tool"]:
        assert f'name="{field}"' not in body, field
    staff_client.post(_change(step), {"status": "done", "attempts": "0"})
    step.refresh_from_db()
    assert step.status == Step.Status.NEEDS_REVIEW
    assert step.attempts == 1


def test_events_are_view_only_and_cannot_be_deleted_on_their_own(staff_client, world):
    event = world["event"]
    page = staff_client.get(_change(event))
    assert page.status_code == 200
    assert b'name="kind"' not in page.content
    assert b'value="Save"' not in page.content
    assert staff_client.post(_change(event), {"kind": "forged"}).status_code == 403
    assert staff_client.get(_delete(event)).status_code == 403
    assert staff_client.post(_delete(event), {"post": "yes"}).status_code == 403
    assert staff_client.get(reverse("admin:tasks_event_add")).status_code == 403
    listing = staff_client.get(_changelist(Event))
    assert b"delete_selected" not in listing.content
    assert Event.objects.get(pk=event.pk).kind == "tool_call_started"


@pytest.mark.parametrize("key", ["task", "done", "turn", "round"])
def test_tasks_steps_and_council_rows_cannot_be_deleted_on_their_own(
    staff_client, world, key
):
    obj = world[key]
    assert staff_client.post(_delete(obj), {"post": "yes"}).status_code == 403
    assert type(obj).objects.filter(pk=obj.pk).exists()
    listing = staff_client.get(_changelist(type(obj)))
    assert b'value="delete_selected"' not in listing.content


def test_bulk_delete_of_tasks_is_refused_even_when_posted_directly(staff_client, world):
    response = staff_client.post(
        _changelist(Task),
        {
            "action": "delete_selected",
            "_selected_action": [world["task"].pk],
            "post": "yes",
        },
    )
    assert Task.objects.filter(pk=world["task"].pk).exists()
    assert response.status_code in (200, 302)


def test_an_artifacts_sha_size_and_class_are_read_only(staff_client, world):
    artifact = world["output"]
    before = (artifact.sha256, artifact.size, artifact.artifact_class)
    body = staff_client.get(_change(artifact)).content.decode()
    for field in ["sha256", "size", "artifact_class", "integrity"]:
        assert f'name="{field}"' not in body, field
    assert "task 1" in body or f"task {world['task'].pk}" in body
    response = staff_client.post(
        _change(artifact),
        {
            "title": "closes (renamed)",
            "sha256": "0" * 64,
            "size": "1",
            "artifact_class": "4",
            "integrity": "ok",
            "source_links-TOTAL_FORMS": "0",
            "source_links-INITIAL_FORMS": "0",
            "source_links-MIN_NUM_FORMS": "0",
            "source_links-MAX_NUM_FORMS": "1000",
        },
    )
    assert response.status_code == 302
    artifact.refresh_from_db()
    assert artifact.title == "closes (renamed)"
    assert (artifact.sha256, artifact.size, artifact.artifact_class) == before


def test_tasks_steps_events_and_artifacts_cannot_be_added_by_hand(staff_client):
    for model in [Task, Step, Event, Artifact, TaskArtifact, Turn]:
        opts = model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
        assert staff_client.get(url).status_code == 403, model


# -- artifact deletion ------------------------------------------------------------------


def test_deleting_an_artifact_a_live_task_keeps_is_refused_with_a_clear_message(
    staff_client, world, blob_store
):
    artifact = world["output"]
    page = staff_client.get(_delete(artifact))
    body = page.content.decode()
    assert "cannot be deleted while anything alive keeps it" in body
    assert f"persisted by task {world['task'].pk}" in body
    assert f"output of task {world['task'].pk} step 1" in body
    staff_client.post(_delete(artifact), {"post": "yes"})
    assert Artifact.objects.filter(pk=artifact.pk).exists()
    assert blob_store.exists(artifact.sha256)


def test_deleting_a_source_another_artifact_names_is_refused(
    staff_client, make_artifact
):
    source = make_artifact(title="source data")
    make_artifact(title="derived chart", source_ids=[source.pk])
    response = staff_client.post(
        _changelist(Artifact),
        {"action": "delete_selected", "_selected_action": [source.pk]},
    )
    body = response.content.decode()
    assert "cannot be deleted while anything alive keeps them" in body
    assert "named as a source by artifact" in body
    assert 'name="post"' not in body
    assert Artifact.objects.filter(pk=source.pk).exists()


def test_deleting_an_artifact_nothing_keeps_removes_its_row_and_its_blob(
    staff_client, make_artifact, blob_store, django_capture_on_commit_callbacks
):
    orphan = make_artifact(title="orphan")
    confirm = staff_client.get(_delete(orphan))
    assert b"Are you sure" in confirm.content
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(_delete(orphan), {"post": "yes"})
    assert response.status_code == 302
    assert not Artifact.objects.filter(pk=orphan.pk).exists()
    assert not blob_store.exists(orphan.sha256)


def _queries_for(client, url: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("model", [Task, Step, Event, Artifact, TaskArtifact])
def test_list_pages_do_not_run_more_queries_with_more_rows(
    staff_client, make_task, make_artifact, model
):
    def add_rows(n: int) -> None:
        for _ in range(n):
            task = make_task(brain="claude")
            artifact = make_artifact()
            step = Step.objects.create(
                task=task, position=1, title="s", tool="t", status="needs_review"
            )
            TaskArtifact.objects.create(task=task, step=step, artifact=artifact)
            event_append(task_id=task.pk, step_id=step.pk, kind="tool_call_started")

    url = _changelist(model)
    add_rows(2)
    few = _queries_for(staff_client, url)
    add_rows(20)
    many = _queries_for(staff_client, url)
    assert many == few
