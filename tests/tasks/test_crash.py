"""Crash tests with real processes: a worker is SIGKILLed at each envelope boundary.

Each task runs the four classes in order (2: fetch, 1: file, 3: snapshot,
4: render of step 1); every output is a file in the blob store, whatever its
size. A worker process is armed with
``PIPPA_CRASHPOINT=<boundary>:<n>`` so it kills itself with SIGKILL at the
n-th step's boundary; then a fresh worker process resumes. Real tool calls
are counted through a side channel (a file every tool call appends to).
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from artifacts.models import Artifact
from artifacts.services import artifact_store
from artifacts.store import FolderStore
from tasks.crashpoints import BOUNDARIES
from tasks.models import Event, Step, Task, TaskArtifact
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.blobs import blob_lose
from tests.support.executing import check_invariants, expire_lease, invocations
from tests.support.workers import tools_env, worker_argv

PLAN = [
    {"title": "fetch", "tool": "test.fetch", "args": {}},
    {"title": "file", "tool": "test.file", "args": {}},
    {"title": "snapshot", "tool": "test.snapshot", "args": {}},
    {"title": "render", "tool": "test.render", "args": {"source": 1}},
]
CLASS_AT = {1: 2, 2: 1, 3: 3, 4: 4}  # position -> artifact class

# Real calls of the crashed step after the resume, by (boundary, class).
EXPECTED_CALLS = {
    "before_started_commit": {1: 1, 2: 1, 3: 1, 4: 1},
    "after_started": {1: 1, 2: 1, 3: 1, 4: 1},
    "after_tool": {1: 2, 2: 2, 3: 2, 4: 2},
    # The file was written but never named: the call was never shown.
    "after_blob": {1: 2, 2: 2, 3: 2, 4: 2},
    "after_result": {1: 1, 2: 1, 3: 1, 4: 1},
}
# The rule the resuming worker logs for the crashed step, by (boundary, class).
EXPECTED_RULE = {
    "before_started_commit": {},
    "after_started": {
        1: "class1_regenerate_unsaved",
        2: "class2_fetch_again",
        3: "class3_issue_again_unshown",
        4: "class4_rerender",
    },
    "after_tool": {
        1: "class1_regenerate_unsaved",
        2: "class2_fetch_again",
        3: "class3_issue_again_unshown",
        4: "class4_rerender",
    },
    "after_blob": {
        1: "class1_regenerate_unsaved",
        2: "class2_fetch_again",
        3: "class3_issue_again_unshown",
        4: "class4_rerender",
    },
    "after_result": {},
}


@pytest.fixture
def blob_store(any_store):
    """Every crash here runs on the folder and on a bucket (SeaweedFS)."""
    return any_store


@pytest.fixture
def worker(blob_store, subprocess_env, tmp_path):
    """Start a worker process on this test's database and blob store."""
    log = tmp_path / "tool-calls.jsonl"

    def start(*task_ids: int, crashpoint: str = "", name: str = "w"):
        env = tools_env(subprocess_env, log, crashpoint=crashpoint)
        return subprocess.Popen(
            worker_argv(*task_ids, worker_id=f"worker:{name}"),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    start.log = log
    return start


def fetch_bytes(step: Step) -> bytes:
    """What ``test.fetch`` returns for this step (its stable payload)."""
    from tests.support.tools import _payload

    ctx = type("Ctx", (), {"task_id": step.task_id, "step_id": step.pk})()
    ctx.generation = step.generation
    return _payload(ctx, 256, stable=True)


def wait(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_worker_killed_at_a_boundary_is_resumed_by_class_rule(
    boundary, make_conversation, make_user, worker, blob_store, settings
):
    conversation = make_conversation()
    tasks = {
        position: task_create(
            conversation=conversation, title=f"crash at {position}", steps=PLAN
        )
        for position in CLASS_AT
    }
    # Another owner already stored the bytes each fetch step will produce,
    # described differently: the resumed steps must still write their own
    # owner's rows, and never touch the other owner's.
    stranger = make_user()
    theirs = [
        artifact_store(
            owner=stranger,
            data=fetch_bytes(Step.objects.get(task=task, position=1)),
            media_type="text/html",
            artifact_class=3,
            title="someone else's copy",
        )
        for task in tasks.values()
    ]
    theirs_before = [(a.pk, a.title, a.artifact_class, a.media_type) for a in theirs]
    their_task = Task.objects.create(
        conversation=make_conversation(owner=stranger), title="theirs"
    )
    TaskArtifact.objects.bulk_create(
        [TaskArtifact(task=their_task, artifact=a) for a in theirs]
    )
    # One killed worker per class (the crashed step is that class's position).
    killed = [
        worker(task.pk, crashpoint=f"{boundary}:{position}", name=f"doomed-{position}")
        for position, task in tasks.items()
    ]
    for proc in killed:
        code, err = wait(proc)
        assert code == -signal.SIGKILL, err
    held = {}
    for position, task in tasks.items():
        crashed = Step.objects.get(task=task, position=position)
        before = {s.position: s.status for s in Step.objects.filter(task=task)}
        assert all(before[p] == "done" for p in range(1, position)), before
        assert before[position] == (
            "done"
            if boundary == "after_result"
            else "pending"
            if boundary == "before_started_commit"
            else "running"
        )
        assert crashed.attempts == (0 if boundary == "before_started_commit" else 1)
        held[task.pk] = Task.objects.get(pk=task.pk).lease_owner
        expire_lease(task.pk)

    code, err = wait(worker(*[t.pk for t in tasks.values()], name="fresh"))
    assert code == 0, err
    assert "database is locked" not in err

    calls = invocations(worker.log)
    for position, task in tasks.items():
        task.refresh_from_db()
        assert (task.status, task.steps_done) == ("done", 4), (position, task.status)
        steps = {s.position: s for s in Step.objects.filter(task=task)}
        cls = CLASS_AT[position]
        assert calls[steps[position].pk] == EXPECTED_CALLS[boundary][cls], (
            f"class {cls} at {boundary}"
        )
        for other in set(steps) - {position}:
            assert calls[steps[other].pk] == 1
        rules = list(
            Event.objects.filter(
                step=steps[position], kind="uncertain_resolved"
            ).values_list("data__rule", flat=True)
        )
        expected = EXPECTED_RULE[boundary].get(cls)
        assert rules == ([expected] if expected else [])
        if held[task.pk]:
            takeover = Event.objects.get(task=task, kind="lease_taken_over")
            assert takeover.data["previous_owner"] == f"worker:doomed-{position}"
        fetched = steps[1].output
        assert fetched.owner_id == conversation.owner_id
        assert (fetched.artifact_class, fetched.media_type) == (2, "text/plain")
        assert fetched.sha256 in {a.sha256 for a in theirs}
    check_invariants([t.pk for t in tasks.values()])
    if blob_store.kind == "s3":  # the workers wrote to the bucket, not a folder
        assert not list(FolderStore(settings.BLOB_DIR).shas())
    assert [
        (a.pk, a.title, a.artifact_class, a.media_type)
        for a in Artifact.objects.filter(owner=stranger).order_by("pk")
    ] == theirs_before


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_render_whose_source_is_gone_waits_for_a_person(
    make_conversation, worker, blob_store
):
    task = task_create(conversation=make_conversation(), title="render", steps=PLAN)
    code, err = wait(worker(task.pk, crashpoint="after_tool:4", name="doomed"))
    assert code == -signal.SIGKILL, err
    source = Step.objects.get(task=task, position=1).output
    blob_lose(source.sha256, blob_store)
    expire_lease(task.pk)
    code, err = wait(worker(task.pk, name="fresh"))
    assert code == 0, err
    render = Step.objects.get(task=task, position=4)
    task.refresh_from_db()
    assert render.status == "needs_review"
    assert task.status == "needs_review"
    assert invocations(worker.log)[render.pk] == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_side_effect_call_is_never_sent_again_by_a_worker(
    make_conversation, worker
):
    task = task_create(
        conversation=make_conversation(),
        title="notify",
        steps=[{"title": "send", "tool": "test.effect", "args": {}}],
    )
    code, err = wait(worker(task.pk, crashpoint="after_tool", name="doomed"))
    assert code == -signal.SIGKILL, err
    expire_lease(task.pk)
    code, err = wait(worker(task.pk, name="fresh"))
    assert code == 0, err
    sent = Step.objects.get(task=task)
    assert sent.status == "needs_review"
    assert invocations(worker.log)[sent.pk] == 1
    assert Task.objects.get(pk=task.pk).status == "needs_review"


CHART_PLAN = [
    {
        "title": "closes",
        "tool": "demo.closes",
        "args": {"symbol": "PIPA", "start": "2024-01-02", "end": "2024-02-28"},
    },
    {"title": "chart", "tool": "demo.chart", "args": {"source": 1}},
]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_keeping_a_preview_leaves_all_of_it_or_none(
    make_conversation, worker, blob_store
):
    """The preview's row, the widget's record of it and the task's keeper
    link commit together: killed inside that transaction, none of them is
    there, the widget is done without a picture, and the doctor's repair
    sweeps only the PNG file nobody names."""
    from django.core.management import call_command

    from artifacts.preview import preview_status
    from tasks.crashpoints import PREVIEW_BOUNDARY

    task = task_create(
        conversation=make_conversation(), title="chart", steps=CHART_PLAN
    )
    proc = worker(task.pk, crashpoint=PREVIEW_BOUNDARY, name="doomed")
    code, err = wait(proc)
    assert code == -signal.SIGKILL, err
    chart = Step.objects.get(task=task, position=2)
    assert chart.status == "done"  # the result committed before the preview
    widget = chart.output
    assert preview_status(widget) == {}
    assert not Artifact.objects.filter(media_type="image/png").exists()
    assert (
        not TaskArtifact.objects.filter(task=task)
        .exclude(artifact__media_type__in=["text/csv", "image/svg+xml"])
        .exists()
    )
    # The PNG file was written before the transaction: nothing names it.
    named = set(Artifact.objects.values_list("sha256", flat=True))
    stray = set(blob_store.shas()) - named
    assert len(stray) == 1
    call_command("pippa_doctor", "--repair", "--grace-seconds", "0", verbosity=0)
    assert set(blob_store.shas()) == named
    widget.refresh_from_db()
    assert preview_status(widget) == {}
    assert blob_store.verify(widget.sha256)
