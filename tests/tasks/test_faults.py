"""Faults that are not the tool's, in one process: a full blob disk, a result
transaction that fails, and the back-off between a failing tool's attempts.

The disk fills for real (a small tmpfs, filled by the tool itself once its
work is done: "the tool ran, then the disk was full"). Where the database
must fail on one chosen statement, the failure is injected at that statement.
"""

from __future__ import annotations

import random
import re
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.urls import reverse
from django.utils import timezone

from artifacts.models import PendingUnlink
from artifacts.store import default_store
from tasks import actions, executor
from tasks.actions import step_resolve_options
from tasks.executor import step
from tasks.faults import (
    REASON_DB_LOCKED,
    REASON_DB_LOST,
    REASON_DISK_FULL,
    backoff_delay,
    fault_reason,
    store_probe,
)
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tasks.resume import resume_advice
from tests.support.executing import (
    check_invariants,
    expire_lease,
    invocations,
    kinds,
    run_task,
)
from tests.support.faults import fill

UNSAVED = "the tool ran; its output could not be saved: disk full"


@pytest.fixture
def blob_disk(tmpfs, settings):
    """The blob folder on a 4 MiB tmpfs, every output a blob file in it (see
    the SQLite file on a tmpfs in test_worker_faults.py for the database
    filling up)."""
    fs = tmpfs("blobfs", 4 * 1024 * 1024)
    settings.BLOB_DIR = fs.root / "blobs"
    return fs


def one_step(make_conversation, tool: str, **args) -> Task:
    return task_create(
        conversation=make_conversation(),
        title=tool,
        steps=[{"title": tool, "tool": tool, "args": args}],
    )


def seconds_in(text: str, lead: str) -> int:
    """The N of "<lead> in N s" in ``text``."""
    found = re.search(re.escape(lead) + r" in (\d+) s", text)
    assert found, f"{lead!r} not in {text[:2000]!r}"
    return int(found.group(1))


def temp_files() -> list:
    return list(default_store().iter_temp_files())


# -- a full blob folder ----------------------------------------------------------


@pytest.mark.django_db
def test_a_full_disk_after_a_tool_with_outside_effects_sends_once_and_asks_a_person(
    make_conversation, blob_disk, tool_log
):
    task = one_step(make_conversation, "test.effect", fill=str(blob_disk.filler))

    outcome = step(task_id=task.pk, worker_id="worker:a")

    assert (outcome.status, outcome.task_status) == ("needs_review", "needs_review")
    assert outcome.fault == REASON_DISK_FULL
    assert outcome.error == f"needs you: {UNSAVED}"
    the_step = Step.objects.get(task=task)
    assert the_step.status == "needs_review"
    assert the_step.error == f"needs you: {UNSAVED}"
    task.refresh_from_db()
    assert (task.status, task.lease_owner) == ("needs_review", "")
    # Never recorded as the tool failing, never called again by itself.
    assert "tool_call_failed" not in kinds(task.pk)
    assert step(task_id=task.pk, worker_id="worker:b") is None
    assert invocations(tool_log, "test.effect") == {the_step.pk: 1}
    assert temp_files() == []
    # A person decides: the same call again (same key), or give up.
    blob_disk.free()
    assert step_resolve_options(the_step) == ["rerun", "fail", "skip"]
    assert resume_advice(the_step).words == f"needs you: {UNSAVED}"


@pytest.mark.django_db
def test_a_full_disk_after_an_idempotent_fetch_waits_and_then_fetches_again(
    make_conversation, blob_disk, tool_log
):
    task = one_step(make_conversation, "test.fetch", fill=str(blob_disk.filler))

    outcome = step(task_id=task.pk, worker_id="worker:a")

    assert outcome.fault == REASON_DISK_FULL
    assert (outcome.status, outcome.task_status) == ("running", "running")
    assert outcome.fault_bytes == 256
    the_step = Step.objects.get(task=task)
    assert (the_step.status, the_step.attempts) == ("running", 1)
    assert kinds(task.pk, the_step.pk) == ["tool_call_started", "output_unsaved"]
    unsaved = Event.objects.get(task=task, kind="output_unsaved")
    assert (unsaved.data["reason"], unsaved.data["stage"]) == ("disk full", "blob")
    assert store_probe(needed=outcome.fault_bytes) == REASON_DISK_FULL
    assert temp_files() == []

    blob_disk.free()
    assert store_probe(needed=outcome.fault_bytes) == ""
    outcomes = run_task(task.pk, worker_id="worker:a")

    assert [(o.status, o.rule) for o in outcomes] == [("done", "class2_fetch_again")]
    assert invocations(tool_log, "test.fetch") == {the_step.pk: 2}
    check_invariants([task.pk])


@pytest.mark.django_db
def test_a_snapshot_that_met_a_full_disk_was_never_shown_so_it_is_taken_again(
    make_conversation, blob_disk, tool_log
):
    task = one_step(make_conversation, "test.snapshot", fill=str(blob_disk.filler))
    assert step(task_id=task.pk, worker_id="worker:a").fault == REASON_DISK_FULL
    blob_disk.free()
    expire_lease(task.pk)  # worker:a gave up; another worker resumes the step

    outcomes = run_task(task.pk, worker_id="worker:b")

    assert [o.rule for o in outcomes] == ["class3_issue_again_unshown"]
    task.refresh_from_db()
    assert task.status == "done"
    check_invariants([task.pk])


@pytest.mark.django_db
def test_a_file_tool_that_meets_a_full_disk_fails_its_attempt_and_stops_the_worker(
    make_conversation, blob_disk, tool_log, settings
):
    """The class-1 tool's own write fails: its attempt, but the disk's fault.

    Retrying at once would only meet the same full disk (a soak once burnt a
    thousand attempts so): the outcome hands the worker the fault, so it backs
    off until its probe finds room, which covers the files root too.
    """
    settings.PIPPA_RETRY_BASE_SECONDS = 0  # a retry at once: the tight loop
    task = one_step(make_conversation, "test.file", size=1024)
    fill(blob_disk.filler)

    outcome = step(task_id=task.pk, worker_id="worker:a")

    assert outcome.fault == REASON_DISK_FULL
    assert (outcome.status, outcome.task_status) == ("pending", "running")
    the_step = Step.objects.get(task=task)
    assert (the_step.status, the_step.attempts) == ("pending", 1)
    assert "No space left on device" in the_step.error
    failed = Event.objects.get(task=task, kind="tool_call_failed")
    assert (failed.data["reason"], failed.data["will_retry"]) == ("disk full", True)
    assert store_probe() == REASON_DISK_FULL

    blob_disk.free()
    assert store_probe() == ""
    outcomes = run_task(task.pk, worker_id="worker:a")

    assert [o.status for o in outcomes] == ["done"]
    assert invocations(tool_log, "test.file") == {the_step.pk: 2}
    check_invariants([task.pk])


@pytest.mark.django_db
def test_the_store_probe_finds_a_full_files_root_kept_apart_from_the_blobs(
    tmpfs, settings, tmp_path
):
    fs = tmpfs("filesfs", 1024 * 1024)
    settings.BLOB_DIR = tmp_path / "blobs"
    settings.PIPPA_FILES_DIR = str(fs.root / "files")
    fill(fs.filler)
    assert store_probe() == REASON_DISK_FULL
    fs.free()
    assert store_probe() == ""


# -- the result transaction fails (injected at that one statement) -------------


def fail_finish_once(monkeypatch, message: str = "database or disk is full") -> None:
    real = executor.result_commit
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError(message)
        return real(*args, **kwargs)

    monkeypatch.setattr(executor, "result_commit", failing)


@pytest.mark.django_db
def test_a_result_transaction_that_fails_issues_the_unshown_snapshot_again(
    make_conversation, monkeypatch, tool_log, blob_store
):
    """The payload's event and the result commit together: when that commit
    fails, nothing was shown, the written file is handed to the pending-unlink
    record, and the snapshot is taken again (class 3's rule for a call whose
    result was never shown)."""
    fail_finish_once(monkeypatch)
    task = one_step(make_conversation, "test.snapshot")

    outcome = step(task_id=task.pk, worker_id="worker:a")

    assert (outcome.status, outcome.fault) == ("running", REASON_DISK_FULL)
    the_step = Step.objects.get(task=task)
    assert kinds(task.pk, the_step.pk) == ["tool_call_started", "output_unsaved"]
    outcomes = run_task(task.pk, worker_id="worker:a")
    assert [(o.status, o.rule, o.invoked) for o in outcomes] == [
        ("done", "class3_issue_again_unshown", True)
    ]
    assert invocations(tool_log, "test.snapshot") == {the_step.pk: 2}
    check_invariants([task.pk])
    # The file no row names is on the pending-unlink record (unlinked after
    # the commit, which a test's own transaction never reaches).
    named = Step.objects.get(task=task).output.sha256
    unnamed = {sha for sha, _ in blob_store.iter_files()} - {named}
    assert len(unnamed) == 1
    assert set(PendingUnlink.objects.values_list("sha256", flat=True)) == unnamed


@pytest.mark.django_db
def test_a_result_transaction_that_fails_after_an_outside_effect_goes_to_a_person(
    make_conversation, monkeypatch, tool_log
):
    fail_finish_once(monkeypatch, "database is locked")
    task = one_step(make_conversation, "test.effect")

    outcome = step(task_id=task.pk, worker_id="worker:a")

    assert outcome.status == "needs_review"
    reason = "the tool ran; its output could not be saved: the database is locked"
    assert Step.objects.get(task=task).error == f"needs you: {reason}"
    # Nothing was saved to adopt: a person sends the call again, or not.
    assert step_resolve_options(Step.objects.get(task=task))[0] == "rerun"
    assert "adopt" not in step_resolve_options(Step.objects.get(task=task))
    assert sum(invocations(tool_log, "test.effect").values()) == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(28, "No space left on device"), REASON_DISK_FULL),
        (OperationalError("database or disk is full"), REASON_DISK_FULL),
        (OperationalError("database is locked"), REASON_DB_LOCKED),
        (
            OperationalError("terminating connection due to administrator command"),
            REASON_DB_LOST,
        ),
        (OperationalError("the database system is starting up"), REASON_DB_LOST),
    ],
)
def test_faults_are_named_in_plain_words(error, reason):
    assert fault_reason(error) == reason


# -- back-off between attempts of a failing tool --------------------------------


def test_back_off_doubles_from_its_base_with_jitter_and_stops_at_its_cap():
    rng = random.Random(12)
    for n, full in enumerate([5, 10, 20, 40, 80, 160, 300, 300, 300], start=1):
        for _ in range(20):
            delay = backoff_delay(n, base=5, cap=300, rng=rng)
            assert full / 2 <= delay <= full
    assert backoff_delay(3, base=0, cap=300) == 0


@pytest.mark.django_db
def test_a_failed_attempt_waits_out_its_back_off_and_the_timeline_says_when(
    make_conversation, settings, tool_log, client
):
    settings.PIPPA_RETRY_BASE_SECONDS = 20
    settings.PIPPA_RETRY_MAX_SECONDS = 300
    conversation = make_conversation()
    task = task_create(
        conversation=conversation,
        title="flaky",
        steps=[{"title": "flaky", "tool": "test.flaky", "args": {"fail_times": 1}}],
    )

    first = step(task_id=task.pk, worker_id="worker:a")

    assert (first.status, first.task_status) == ("pending", "queued")
    the_step = Step.objects.get(task=task)
    # The back-off is counted from the failure's own clock reading (no timing
    # in the test): 20 s with its jitter, stored and logged alike.
    delay = (the_step.next_attempt_at - the_step.finished_at).total_seconds()
    assert 10 <= delay <= 20
    failed = Event.objects.get(task=task, kind="tool_call_failed")
    assert failed.data["retry_in_seconds"] == round(delay, 1)

    def says_the_time_left(shown: int) -> bool:
        # Read after the text was made: whole seconds left then, never more
        # than the back-off, never less than what is left now (however slow
        # this machine is today).
        left = (the_step.next_attempt_at - timezone.now()).total_seconds()
        return max(0, int(left) - 1) <= shown <= int(delay) + 1

    task.refresh_from_db()
    assert task.lease_owner == ""
    # No worker takes it, and a direct step says when, without calling the tool.
    assert not Task.objects.runnable().filter(pk=task.pk).exists()
    events_before = task.last_seq
    waiting = step(task_id=task.pk, worker_id="worker:b")
    assert waiting.status == "pending"
    assert says_the_time_left(
        seconds_in(waiting.error, "waiting before attempt 2: next attempt")
    )
    task.refresh_from_db()
    assert (task.last_seq, task.lease_owner) == (events_before, "")
    assert sum(invocations(tool_log).values()) == 1
    # The timeline tells Dad when the next attempt comes.
    client.force_login(conversation.owner)
    page = client.get(reverse("dashboard:task", args=[task.pk]))
    assert says_the_time_left(seconds_in(page.content.decode(), "next attempt"))
    words = resume_advice(the_step).words
    assert says_the_time_left(seconds_in(words, "the tool failed, next attempt"))

    # Time passes.
    Step.objects.filter(pk=the_step.pk).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )
    assert Task.objects.runnable().filter(pk=task.pk).exists()
    outcomes = run_task(task.pk, worker_id="worker:b")
    assert [o.status for o in outcomes] == ["done"]
    assert Step.objects.get(pk=the_step.pk).next_attempt_at is None
    check_invariants([task.pk])


@pytest.mark.django_db
def test_a_retry_by_a_person_does_not_wait_out_the_old_back_off(
    make_conversation, settings
):
    settings.PIPPA_RETRY_BASE_SECONDS = 60
    task = task_create(
        conversation=make_conversation(),
        title="flaky",
        steps=[
            {
                "title": "flaky",
                "tool": "test.flaky",
                "args": {"fail_times": 1},
                "max_attempts": 2,
            }
        ],
    )
    step(task_id=task.pk, worker_id="worker:a")
    the_step = Step.objects.get(task=task)
    Step.objects.filter(pk=the_step.pk).update(status="failed")

    actions.step_retry(step=the_step, actor="dad")

    assert Step.objects.get(pk=the_step.pk).next_attempt_at is None
    assert Task.objects.runnable().filter(pk=task.pk).exists()
