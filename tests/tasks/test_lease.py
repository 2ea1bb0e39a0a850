"""One rule for a dead lease, one release, crash points armed only on purpose."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from dashboard.selectors.timeline import (
    task_poll_state_for_user,
    worker_busy_elsewhere,
)
from tasks import statements as sql
from tasks.actions import step_resolve, step_resolve_options
from tasks.doctor import _open_envelopes
from tasks.executor import step
from tasks.lease import lease_release, lease_take
from tasks.models import (
    LEASE_DEAD,
    Event,
    Step,
    Task,
    lease_dead,
    lease_dead_q,
    needs_you_q,
)
from tasks.plan import task_create
from tasks.services import events_append
from tests.support.executing import crash_at, expire_lease

PLAN = [{"title": "Closes", "tool": "demo.closes", "args": {}}]
WIDGET_PLAN = [
    {"title": "Closes", "tool": "demo.closes", "args": {}},
    {"title": "Chart", "tool": "demo.chart", "args": {"source": 1}},
]
REPO = Path(__file__).resolve().parents[2]


def _task(make_conversation, *, owner: str, expires, steps=PLAN) -> Task:
    task = task_create(conversation=make_conversation(), title="t", steps=steps)
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING, lease_owner=owner, lease_expires_at=expires
    )
    task.refresh_from_db()
    return task


def _dead_by_sql(task_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Task._meta.db_table} WHERE id = %s AND {LEASE_DEAD}",
            [task_id, connection.ops.adapt_datetimefield_value(timezone.now())],
        )
        return cursor.fetchone() is not None


def _taken(task: Task) -> tuple[bool, bool]:
    """Whether another worker takes the lease: through ``lease_take`` (its
    read of the holder), and by the ``LEASE_TAKE`` statement alone; each in a
    savepoint rolled back."""
    answers = []
    for take in (_take_by_lease_take, _take_by_statement):
        with transaction.atomic():
            answers.append(take(task))
            transaction.set_rollback(True)
    return answers[0], answers[1]


def _take_by_lease_take(task: Task) -> bool:
    return lease_take(sql.cursor(), task.pk, "worker:next") is not None


def _take_by_statement(task: Task) -> bool:
    now = sql.db_datetime(timezone.now())
    cursor = sql.cursor()
    cursor.execute(
        sql.LEASE_TAKE,
        [
            "worker:next",
            now,
            Task.Status.RUNNING,
            now,
            task.pk,
            task.lease_owner,
            now,
            Task.Status.QUEUED,
            Task.Status.RUNNING,
        ],
    )
    return cursor.fetchone() is not None


def _stopped_readers(task: Task) -> tuple[bool, bool]:
    """A person stopped the task while its first step was in flight: whether
    the step needs a person now (``needs_you_q``), and whether the doctor
    calls its envelope one no worker will resolve (a lease later)."""
    Task.objects.filter(pk=task.pk).update(status=Task.Status.NEEDS_REVIEW)
    first = Step.objects.filter(task=task).order_by("position").first()
    Step.objects.filter(pk=first.pk).update(status=Step.Status.RUNNING)
    events_append(
        task_id=task.pk, entries=[(Event.Kind.TOOL_CALL_STARTED, first.pk, {})]
    )
    needs_you = Step.objects.filter(needs_you_q(), pk=first.pk).exists()
    later = timezone.now() + timedelta(seconds=settings.PIPPA_LEASE_SECONDS + 1)
    doctor = any(found[2] == first.pk for found in _open_envelopes(later))
    return needs_you, doctor


CASES = {
    # name: (owner, expiry from now in seconds or None, dead?)
    "no holder": ("", None, True),
    "holder with no expiry": ("worker:gone", None, True),
    "holder past expiry": ("worker:gone", -5, True),
    "holder before expiry": ("worker:live", 3600, False),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(CASES))
def test_every_reader_of_a_lease_agrees_whether_it_is_dead(case, make_conversation):
    owner, seconds, dead = CASES[case]
    expires = None if seconds is None else timezone.now() + timedelta(seconds=seconds)
    task = _task(make_conversation, owner=owner, expires=expires)
    other = _task(make_conversation, owner="", expires=None)
    user = task.conversation.owner

    # The rule's three spellings (tasks.models.LEASE_DEAD_WHEN).
    assert lease_dead(owner, expires) is dead
    assert Task.objects.filter(lease_dead_q(), pk=task.pk).exists() is dead
    assert _dead_by_sql(task.pk) is dead
    # Their readers: the ORM's, one row's, a step's task, the dashboard's.
    assert Task.objects.lease_dead().filter(pk=task.pk).exists() is dead
    assert Step.objects.filter(lease_dead_q("task__"), task=task).exists() is dead
    assert task.lease_live is not dead
    assert Task.objects.runnable().filter(pk=task.pk).exists() is dead
    stale = dead and bool(owner)
    assert Task.objects.lease_stale().filter(pk=task.pk).exists() is stale
    assert task.lease_expired is stale
    assert task_poll_state_for_user(user=user, task_id=task.pk)[1] is not dead
    assert worker_busy_elsewhere(task=other) is not dead
    # The hot path's take: the holder's read, then the statement's re-check.
    assert _taken(task) == (dead, dead)
    # The hand-written statements of the needs-you rule and the doctor.
    assert _stopped_readers(task) == (dead, dead)


@pytest.mark.django_db
def test_a_holder_with_no_expiry_is_taken_over_by_the_next_worker(make_conversation):
    task = _task(make_conversation, owner="worker:gone", expires=None)

    outcome = step(task_id=task.pk, worker_id="worker:next")

    assert outcome.status == "done"
    takeover = Event.objects.get(task=task, kind="lease_taken_over")
    assert takeover.data["previous_owner"] == "worker:gone"


@pytest.mark.django_db
def test_the_admin_filter_and_the_doctor_see_the_same_stale_leases(
    make_conversation, admin_client
):
    from tasks.doctor import doctor_run

    now = timezone.now()
    stale = [
        _task(make_conversation, owner="worker:a", expires=None),
        _task(make_conversation, owner="worker:b", expires=now - timedelta(seconds=9)),
    ]
    _task(make_conversation, owner="worker:c", expires=now + timedelta(minutes=5))
    _task(make_conversation, owner="", expires=None)
    url = reverse("admin:tasks_task_changelist")

    listed = admin_client.get(url, {"lease_expired": "yes"}).context["cl"].queryset
    report = doctor_run(repair=False, verify=False)

    assert sorted(t.pk for t in listed) == sorted(t.pk for t in stale)
    assert report.finding("expired_leases").found == len(stale)


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["person", "doctor", "runner"])
def test_every_release_puts_a_running_task_back_in_the_queue(who, make_conversation):
    past = timezone.now() - timedelta(seconds=5)
    task = _task(make_conversation, owner="worker:gone", expires=past)

    if who == "person":
        released = lease_release(task=task, actor="staff:dad")
    elif who == "doctor":
        released = lease_release(
            task=task, actor="doctor", owner="worker:gone", dead_only=True
        )
    else:
        released = lease_release(task=task, actor="worker:gone")

    task.refresh_from_db()
    assert released is True
    assert (task.status, task.lease_owner, task.lease_expires_at) == (
        "queued",
        "",
        None,
    )
    event = Event.objects.filter(task=task, kind="lease_released").last()
    assert event.data["previous_owner"] == "worker:gone"


@pytest.mark.django_db
def test_the_doctors_release_leaves_a_lease_taken_since_its_check(make_conversation):
    task = _task(
        make_conversation,
        owner="worker:new",
        expires=timezone.now() + timedelta(minutes=5),
    )

    stale_owner = lease_release(
        task=task, actor="doctor", owner="worker:old", dead_only=True
    )
    now_live = lease_release(
        task=task, actor="doctor", owner="worker:new", dead_only=True
    )

    task.refresh_from_db()
    assert (stale_owner, now_live) == (False, False)
    assert (task.lease_owner, task.status) == ("worker:new", "running")
    assert not Event.objects.filter(task=task, kind="lease_released").exists()


@pytest.mark.django_db(transaction=True)
def test_an_operators_adopt_renders_the_widget_preview_after_the_commit(
    make_conversation, monkeypatch
):
    import artifacts.preview

    task = task_create(conversation=make_conversation(), title="t", steps=WIDGET_PLAN)
    crash_at(task.pk, "after_payload:2")
    expire_lease(task.pk)
    chart = Step.objects.get(task=task, position=2)
    assert "adopt" in step_resolve_options(chart)
    real = artifacts.preview.preview_render
    seen = []

    def watched(*, artifact, keep=None):
        seen.append(connection.in_atomic_block)
        return real(artifact=artifact, keep=keep)

    monkeypatch.setattr(artifacts.preview, "preview_render", watched)

    step_resolve(step=chart, action="adopt", actor="staff:dad")

    chart.refresh_from_db()
    assert chart.status == "done"
    assert seen == [False]  # rendered once, outside any transaction
    assert task.artifact_links.filter(artifact__media_type="image/png").exists()


@pytest.mark.slow
def test_importing_the_executor_arms_no_crash_point(subprocess_env, python_exe):
    code = (
        "import django; django.setup();"
        " import tasks.executor, tasks.services; from tasks import crashpoints;"
        " print(repr(crashpoints._crash.name))"
    )
    env = {**subprocess_env, "PIPPA_CRASHPOINT": "after_started"}
    proc = subprocess.run(
        [python_exe, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "''"
