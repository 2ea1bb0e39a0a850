"""pippa_doctor: finds what older code or a crash left, and --repair fixes it."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from artifacts import gc
from artifacts.models import Artifact
from artifacts.store import FolderStore
from tasks import doctor as doctor_module
from tasks.doctor import ENVELOPE_OPEN_REASON, doctor_run
from tasks.models import Conversation, Event, Step, Task, TaskArtifact
from tasks.services import conversation_delete
from tests.support.blobs import blob_lose, blob_overwrite, blob_plant
from tests.support.leftovers import (
    assert_no_leftovers,
    conversation_with_everything,
    find_leftovers,
)

ORPHAN_STEPS = 13_750
ORPHAN_EVENTS = 98_159


@pytest.fixture
def blob_store(any_store):
    """The tests about blobs run on the folder and on a bucket: the doctor
    lists either against the database the same way."""
    return any_store


def doctor(*args: str) -> tuple[int, dict, str]:
    """Run the command with --json; return (exit code, report, stderr)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("pippa_doctor", "--json", *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue()), err.getvalue()


def found(report: dict) -> dict[str, int]:
    return {f["key"]: f["found"] for f in report["findings"] if f["found"]}


def remaining(report: dict) -> dict[str, int]:
    return {f["key"]: f["remaining"] for f in report["findings"] if f["remaining"]}


def raw_sqlite() -> sqlite3.Connection:
    """A second connection to the test database, as the old code had it:
    plain sqlite3, foreign keys never switched on."""
    raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    assert raw.execute("PRAGMA foreign_keys").fetchone()[0] == 0
    return raw


def delete_with_foreign_keys_off(conversation_ids: list[int]) -> None:
    """Delete tasks and conversations the old way: the cascade never fires."""
    marks = ", ".join(["%s"] * len(conversation_ids))
    statements = [
        f"DELETE FROM tasks_task WHERE conversation_id IN ({marks})",
        f"DELETE FROM tasks_conversation WHERE id IN ({marks})",
    ]
    if connection.vendor == "sqlite":
        raw = raw_sqlite()
        for sql in statements:
            raw.execute(sql.replace("%s", "?"), conversation_ids)
        raw.close()
    else:
        # PostgreSQL's way to run with foreign keys off (superuser only).
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")
            for sql in statements:
                cursor.execute(sql, conversation_ids)
            cursor.execute("SET session_replication_role = DEFAULT")


@pytest.mark.django_db
def test_the_doctor_on_a_clean_database_reports_nothing_and_exits_zero(user):
    conversation_with_everything(owner=user)

    code, report, _ = doctor()

    assert code == 0
    assert report["clean"] is True
    assert report["problems"] == 0
    assert found(report) == {}


@pytest.mark.django_db(transaction=True)
def test_orphans_of_a_foreign_keys_off_delete_are_found_and_repaired_in_one_run(
    user, blob_store
):
    """The old bug: task rows deleted over a connection with foreign keys off."""
    doomed = [conversation_with_everything(owner=user)[0] for _ in range(2)]
    survivor, survivor_artifacts = conversation_with_everything(owner=user)
    delete_with_foreign_keys_off([c.pk for c in doomed])

    code, report, _ = doctor("--grace-seconds=0")
    assert code == 1
    assert found(report) == {
        "orphan_rounds": 2,
        "orphan_steps": 6,
        "orphan_events": 12,
        "orphan_links": 4,
        "unowned_artifacts": 8,
    }
    assert Step.objects.count() == 9  # a check alone changes nothing

    code, report, _ = doctor("--repair", "--grace-seconds=0")
    assert code == 0, remaining(report)
    assert report["clean"] is True
    assert_no_leftovers()
    assert set(blob_store.shas()) == {a.sha256 for a in survivor_artifacts.values()}
    assert Event.objects.filter(task__conversation=survivor).count() == 6


@pytest.mark.django_db(transaction=True)
def test_the_repair_deletes_range_by_range_and_leaves_no_orphan_between_ranges(
    user, monkeypatch
):
    """Ranges of three ids: orphans fall in many ranges, survivors between them."""
    monkeypatch.setattr(doctor_module, "CHUNK", 3)
    doomed = [conversation_with_everything(owner=user)[0] for _ in range(3)]
    survivor, _ = conversation_with_everything(owner=user)
    doomed.append(conversation_with_everything(owner=user)[0])
    delete_with_foreign_keys_off([c.pk for c in doomed])

    code, report, stderr = doctor("--repair", "--grace-seconds=0")

    assert code == 0, remaining(report)
    assert found(report)["orphan_events"] == 24
    assert "removed 24/24 events whose task is gone" in stderr
    assert_no_leftovers()
    assert Event.objects.filter(task__conversation=survivor).count() == 6
    assert Event.objects.count() == 6


def insert_orphan_load(steps: int, events: int) -> None:
    """Insert a conversation with ``steps`` steps and ``events`` events through
    raw SQL (executemany), then delete it and its tasks with foreign keys off."""
    json = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    user = get_user_model().objects.create_user("orphan-maker")
    conversation = Conversation.objects.create(owner=user, title="big")
    tasks = Task.objects.bulk_create(
        [Task(conversation=conversation, title=f"t{n}") for n in range(50)]
    )
    task_ids = [t.pk for t in tasks]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO tasks_step (task_id, position, title, status, tool, args, "
            "artifact_class, side_effects, attempts, max_attempts, generation, "
            f"error, created_at) VALUES (%s, %s, 's', 'pending', 't', {json}, 3, "
            "%s, 0, 3, 0, '', %s)",
            [(task_ids[i % 50], i // 50, "{}", False, now) for i in range(steps)],
        )
        cursor.execute(
            "SELECT id FROM tasks_step WHERE task_id IN "
            f"({', '.join(map(str, task_ids))}) ORDER BY id"
        )
        step_ids = [row[0] for row in cursor.fetchall()]
        cursor.executemany(
            "INSERT INTO tasks_event (task_id, step_id, seq, kind, data, created_at) "
            f"VALUES (%s, %s, %s, 'tool_result_persisted', {json}, %s)",
            [
                (task_ids[i % 50], step_ids[i % len(step_ids)], i // 50 + 1, "{}", now)
                for i in range(events)
            ],
        )
    delete_with_foreign_keys_off([conversation.pk])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_doctor_repairs_13750_orphan_steps_and_98159_orphan_events_in_one_run(
    user,
):
    kept, _ = conversation_with_everything(owner=user)
    insert_orphan_load(ORPHAN_STEPS, ORPHAN_EVENTS)
    assert Step.objects.exclude(task_id__in=Task.objects.values("pk")).count() == (
        ORPHAN_STEPS
    )

    code, report, stderr = doctor("--repair", "--grace-seconds=0")

    assert found(report) == {
        "orphan_steps": ORPHAN_STEPS,
        "orphan_events": ORPHAN_EVENTS,
    }
    assert code == 0
    assert remaining(report) == {}
    assert "removed 13,750/13,750 steps whose task is gone" in stderr
    assert Step.objects.count() == 3
    assert Event.objects.count() == 6
    assert Conversation.objects.filter(pk=kept.pk).exists()
    assert_no_leftovers()


@pytest.mark.django_db(transaction=True)
def test_blob_files_that_nothing_names_or_records_wait_out_the_grace_period(
    user, blob_store, monkeypatch
):
    conversation, artifacts = conversation_with_everything(owner=user)
    # Older code deleted without writing the pending unlinks down, and died
    # before unlinking (tests/tasks/test_deletion_faults.py has today's case).
    monkeypatch.setattr(gc, "blobs_unlink_after_commit", lambda **kwargs: None)

    conversation_delete(conversation_id=conversation.pk)

    problems = find_leftovers()
    assert sorted(problems) == sorted(
        f"blob file with no artifact row: {a.sha256}" for a in artifacts.values()
    )
    # Within the grace period the files might be an in-flight write: kept.
    code, report, _ = doctor("--repair")
    assert code == 0
    assert found(report) == {}
    assert len(find_leftovers()) == 4

    code, report, _ = doctor("--repair", "--grace-seconds=0")
    assert code == 0
    assert found(report) == {"orphan_blobs": 4}
    assert_no_leftovers()


@pytest.mark.django_db
def test_two_owners_sharing_bytes_keep_the_blob_through_a_delete_crash_and_repair(
    user, make_user, blob_store, monkeypatch
):
    """Bob stored the same bytes as every artifact of Alice's conversation.
    Alice's conversation goes; a crash skips the unlink; the doctor repairs.
    Bob's rows and their blobs stay through all of it."""
    from artifacts.services import artifact_store

    conversation, artifacts = conversation_with_everything(owner=user)
    bob = make_user(username="bob")
    bobs = {
        name: artifact_store(
            owner=bob,
            data=blob_store.get(a.sha256),
            media_type="text/plain",
            artifact_class=3,
            title=f"Bob's {name}",
        )
        for name, a in artifacts.items()
    }
    bob_task = Task.objects.create(
        conversation=Conversation.objects.create(owner=bob, title="b"), title="b"
    )
    TaskArtifact.objects.bulk_create(
        [TaskArtifact(task=bob_task, artifact=a) for a in bobs.values()]
    )
    monkeypatch.setattr(gc, "blobs_unlink_after_commit", lambda **kwargs: None)

    conversation_delete(conversation_id=conversation.pk)

    assert find_leftovers() == []  # every file is still named by Bob's rows
    code, report, _ = doctor("--repair", "--grace-seconds=0")
    assert code == 0
    assert found(report) == {}
    assert {a.pk for a in Artifact.objects.all()} == {a.pk for a in bobs.values()}
    assert all(blob_store.verify(a.sha256) for a in bobs.values())
    assert_no_leftovers()


@pytest.mark.django_db
def test_stale_temp_files_are_swept_and_fresh_ones_are_left_for_their_writer(
    settings,
):
    """A folder's: a bucket's writes spool into files with no name."""
    blob_store = FolderStore(settings.BLOB_DIR)
    blob_store.put_bytes(b"makes the store's private folders")
    stale = blob_store.tmp_dir / "put-crashed"
    fresh = blob_store.tmp_dir / "put-in-flight"
    stale.write_bytes(b"half a payload")
    fresh.write_bytes(b"being written")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))

    code, report, _ = doctor("--repair")

    assert found(report) == {"stale_temp_files": 1}
    assert code == 0
    assert not stale.exists()
    assert fresh.exists()


@pytest.mark.django_db(transaction=True)
def test_an_unlinked_artifact_is_left_alone_within_the_grace_period(make_artifact):
    """Write before show: between artifact_store and its link, nothing keeps it."""
    artifact = make_artifact()

    assert found(doctor("--repair")[1]) == {}
    assert Artifact.objects.filter(pk=artifact.pk).exists()

    code, report, _ = doctor("--repair", "--grace-seconds=0")
    assert found(report) == {"unowned_artifacts": 1}
    assert code == 0
    assert not Artifact.objects.exists()


@pytest.mark.django_db
def test_missing_and_corrupt_blobs_are_flagged_never_deleted(
    make_task, make_artifact, blob_store
):
    task = make_task()
    missing, corrupt, fine = make_artifact(), make_artifact(), make_artifact()
    for artifact in (missing, corrupt, fine):
        TaskArtifact.objects.create(task=task, artifact=artifact)
    blob_lose(missing.sha256, blob_store)
    blob_overwrite(corrupt.sha256, b"payload X", blob_store)  # same size, wrong bytes

    code, report, _ = doctor("--repair", "--grace-seconds=0")

    assert code == 1
    assert found(report) == {"damaged_blobs": 2}
    assert remaining(report) == {"damaged_blobs": 2}
    assert dict(Artifact.objects.values_list("pk", "integrity")) == {
        missing.pk: "missing",
        corrupt.pk: "corrupt",
        fine.pk: "ok",
    }
    damaged = next(f for f in report["findings"] if f["key"] == "damaged_blobs")
    assert "restore the blob" in damaged["advice"]


@pytest.mark.django_db
def test_a_restored_blob_clears_its_damage_flag(make_task, make_artifact, blob_store):
    artifact = make_artifact(data=b"restorable")
    TaskArtifact.objects.create(task=make_task(), artifact=artifact)
    Artifact.objects.filter(pk=artifact.pk).update(integrity="missing")

    code, _, _ = doctor("--repair")

    assert code == 0
    assert Artifact.objects.get(pk=artifact.pk).integrity == "ok"


@pytest.mark.django_db
def test_an_expired_lease_is_released_with_an_event(make_task):
    past = timezone.now() - timedelta(minutes=5)
    expired = make_task(status="running", lease_owner="worker:a", lease_expires_at=past)
    live = make_task(
        status="running",
        lease_owner="worker:b",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )

    code, report, _ = doctor("--repair")

    assert found(report) == {"expired_leases": 1}
    assert code == 0
    expired.refresh_from_db()
    live.refresh_from_db()
    assert (expired.lease_owner, expired.lease_expires_at) == ("", None)
    assert live.lease_owner == "worker:b"
    event = Event.objects.get(task=expired)
    assert (event.kind, event.data["actor"], event.data["previous_owner"]) == (
        "lease_released",
        "doctor",
        "worker:a",
    )


def open_envelope(task: Task, *, age: timedelta, closed: bool = False) -> Step:
    step = Step.objects.create(
        task=task, position=1, title="search", tool="web_search", status="running"
    )
    started = timezone.now() - age
    Event.objects.create(
        task=task, step=step, seq=1, kind="tool_call_started", created_at=started
    )
    if closed:
        Event.objects.create(
            task=task, step=step, seq=2, kind="tool_call_failed", created_at=started
        )
    Task.objects.filter(pk=task.pk).update(last_seq=2 if closed else 1)
    return step


@pytest.mark.django_db
def test_the_doctor_leaves_open_tool_calls_to_the_next_worker_and_hands_only_abandoned_ones_to_a_person(
    make_task, settings
):
    settings.PIPPA_LEASE_SECONDS = 60
    old = timedelta(minutes=10)
    # Workers will resolve these by class: the doctor must not decide for them.
    dead_lease = open_envelope(
        make_task(
            status="running",
            lease_owner="worker:gone",
            lease_expires_at=timezone.now() - timedelta(minutes=5),
        ),
        age=old,
    )
    queued = open_envelope(make_task(status="queued"), age=old)
    paused = open_envelope(make_task(status="paused"), age=old)
    held = open_envelope(
        make_task(
            status="running",
            lease_owner="worker:slow-tool",
            lease_expires_at=timezone.now() + timedelta(seconds=30),
        ),
        age=old,
    )
    closed = open_envelope(make_task(status="failed"), age=old, closed=True)
    young = open_envelope(make_task(status="failed"), age=timedelta(seconds=5))
    # No worker ever steps a failed task: only a person can settle this call.
    abandoned = open_envelope(make_task(status="failed"), age=old)

    code, report, _ = doctor("--repair")

    assert found(report) == {"open_envelopes": 1, "expired_leases": 1}
    assert code == 0
    statuses = dict(Step.objects.values_list("pk", "status"))
    assert statuses == {
        dead_lease.pk: "running",
        queued.pk: "running",
        paused.pk: "running",
        held.pk: "running",
        closed.pk: "running",
        young.pk: "running",
        abandoned.pk: "needs_review",
    }
    # The dead lease is given back; the open call stays for the next worker.
    task = Task.objects.get(pk=dead_lease.task_id)
    assert (task.status, task.lease_owner) == ("queued", "")
    assert Task.objects.get(pk=abandoned.task_id).status == "failed"
    event = Event.objects.filter(step=abandoned).order_by("seq").last()
    assert (event.kind, event.data["reason"]) == (
        "step_needs_review",
        ENVELOPE_OPEN_REASON.format(status="failed"),
    )


@pytest.mark.django_db
def test_after_an_operator_rerun_the_doctor_leaves_the_step_alone(
    make_conversation, settings
):
    from tasks.actions import step_resolve
    from tasks.plan import task_create
    from tests.support.executing import crash_at, expire_lease, run_task

    task = task_create(
        conversation=make_conversation(),
        title="notify",
        steps=[{"title": "notify", "tool": "test.effect"}],
    )
    crash_at(task.pk, "after_tool")
    expire_lease(task.pk)
    run_task(task.pk, worker_id="worker:b")  # outside effects: needs review
    the_step = Step.objects.get(task=task)
    step_resolve(step=the_step, action="rerun", actor="dad")
    settings.PIPPA_LEASE_SECONDS = 0  # every call counts as old

    code, report, _ = doctor("--repair")

    assert (code, found(report)) == (0, {})
    the_step.refresh_from_db()
    task.refresh_from_db()
    assert (the_step.status, task.status) == ("pending", "queued")


@pytest.mark.django_db
def test_json_goes_to_stdout_and_progress_to_stderr(user):
    conversation_with_everything(owner=user)

    code, report, stderr = doctor("--no-verify")

    assert code == 0
    assert set(report) == {
        "clean",
        "repair",
        "store",
        "problems",
        "seconds",
        "findings",
    }
    assert "doctor: checking steps whose task is gone" in stderr


@pytest.mark.django_db
def test_the_plain_report_names_each_problem_and_exits_nonzero(make_artifact):
    make_artifact()
    out = StringIO()

    with pytest.raises(CommandError, match="1 problem") as excinfo:
        call_command("pippa_doctor", "--grace-seconds=0", stdout=out, stderr=StringIO())

    assert excinfo.value.returncode == 1
    assert "artifacts nothing alive keeps: 1 found" in out.getvalue()


@pytest.mark.django_db
def test_the_report_functions_are_importable_for_the_admin(user, blob_store):
    conversation_with_everything(owner=user)

    report = doctor_run(store=blob_store)

    assert report.clean
    assert report.finding("orphan_events").found == 0
    assert report.as_dict()["repair"] is False


@pytest.mark.django_db
def test_the_doctor_lists_the_store_against_the_rows_stray_missing_and_damaged(
    make_task, make_artifact, blob_store
):
    """A crash's stray blob is swept; a missing and a rotten one are flagged;
    what is not the store's own (a key of another shape) is never touched."""
    import hashlib

    task = make_task()
    kept, lost, rotten = make_artifact(), make_artifact(), make_artifact()
    for artifact in (kept, lost, rotten):
        TaskArtifact.objects.create(task=task, artifact=artifact)
    stray = hashlib.sha256(b"a crash left me").hexdigest()
    blob_plant(stray, b"a crash left me", blob_store)
    blob_lose(lost.sha256, blob_store)
    blob_overwrite(rotten.sha256, b"rotten!!!", blob_store)
    if blob_store.kind == "s3":
        foreign = f"{blob_store.prefix}notes/readme.txt"
        blob_store.client.put_object(Bucket=blob_store.bucket, Key=foreign, Body=b"x")

    code, report, _ = doctor("--grace-seconds=0")
    assert code == 1
    assert found(report) == {"orphan_blobs": 1, "damaged_blobs": 2}
    assert report["store"] == blob_store.describe()

    code, report, _ = doctor("--repair", "--grace-seconds=0")
    assert remaining(report) == {"damaged_blobs": 2}
    assert set(blob_store.shas()) == {kept.sha256, rotten.sha256}
    assert blob_store.verify(kept.sha256)
    if blob_store.kind == "s3":
        assert blob_store.client.head_object(Bucket=blob_store.bucket, Key=foreign)


@pytest.mark.django_db
def test_class1_files_of_a_task_whose_delete_was_killed_are_swept_and_a_live_tasks_stay(
    make_conversation, tool_log
):
    """The delete removes its tasks' class-1 folders after its commit; killed
    there (here: its after-commit work never runs), the doctor finds them."""
    from tasks.plan import task_create
    from tasks.tools import files_root
    from tests.support.executing import run_task

    def class1_task():
        task = task_create(
            conversation=make_conversation(),
            title="a file",
            steps=[{"title": "write", "tool": "test.file", "args": {}}],
        )
        run_task(task.pk)
        return task

    gone, live = class1_task(), class1_task()
    conversation_delete(conversation_id=gone.conversation_id)  # no after-commit
    assert (files_root() / f"t{gone.pk}").is_dir()
    code, report, _ = doctor()
    assert "gone_task_files" not in found(report)  # too young: maybe not seen yet

    code, report, _ = doctor("--repair", "--grace-seconds=0")

    assert found(report)["gone_task_files"] == 1
    assert remaining(report) == {}
    assert code == 0
    assert not (files_root() / f"t{gone.pk}").exists()
    assert (files_root() / f"t{live.pk}").is_dir()
