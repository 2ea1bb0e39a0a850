"""A delete finishes itself: a process killed after the delete's commit leaves
its blob unlinks written down, and the next delete, worker start or doctor
run finishes them at once (no grace period). Payload blobs that only an event
of the deleted subtree named go too.
"""

from __future__ import annotations

import json
import signal
import subprocess
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from artifacts.models import PendingUnlink
from artifacts.store import default_store
from tasks.models import Event, Step
from tasks.plan import task_create
from tasks.services import conversation_delete, events_append
from tests.conftest import REPO
from tests.support.executing import crash_at
from tests.support.leftovers import (
    assert_no_leftovers,
    conversation_with_everything,
    subtree_snapshot,
)
from tests.support.workers import tools_env, worker_argv


def interrupted_snapshot(conversation) -> str:
    """A class-3 call cut off between payload_persisted and its result: only
    the event names its blob. Return that sha."""
    task = task_create(
        conversation=conversation,
        title="search",
        steps=[{"title": "search", "tool": "test.snapshot"}],
    )
    crash_at(task.pk, "after_payload")
    event = Event.objects.get(task=task, kind="payload_persisted")
    assert default_store().exists(event.data["sha"])
    return event.data["sha"]


def killed_delete(conversation_id: int, env: dict, python_exe: str) -> None:
    """Delete in a child process that SIGKILLs itself right after the commit."""
    proc = subprocess.run(
        [
            python_exe,
            "manage.py",
            "shell",
            "-c",
            "from tasks import crashpoints; "
            "from tasks.services import conversation_delete; "
            "crashpoints.arm('after_delete_commit'); "
            f"conversation_delete(conversation_id={conversation_id})",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


@pytest.fixture
def killed_after_commit(user, subprocess_env, python_exe):
    """A conversation deleted by a process killed after its commit: the rows are
    gone, every blob file is still there, and the record says which to unlink."""
    conversation, artifacts = conversation_with_everything(owner=user)
    loose = interrupted_snapshot(conversation)
    before = subtree_snapshot(conversation.pk)
    doomed = {a.sha256 for a in artifacts.values()} | {loose}

    killed_delete(conversation.pk, subprocess_env, python_exe)

    assert set(PendingUnlink.objects.values_list("sha256", flat=True)) == doomed
    assert all(default_store().exists(sha) for sha in doomed)
    return before


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_next_delete_finishes_what_a_killed_delete_left(
    killed_after_commit, make_conversation
):
    conversation_delete(conversation_id=make_conversation().pk)

    assert_no_leftovers(killed_after_commit)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_starting_finishes_what_a_killed_delete_left(
    killed_after_commit, subprocess_env
):
    proc = subprocess.run(
        worker_argv(quiet=False),
        cwd=REPO,
        env=tools_env(subprocess_env),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_no_leftovers(killed_after_commit)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_doctor_reports_and_finishes_a_killed_delete_at_once(
    killed_after_commit,
):
    with pytest.raises(CommandError):
        call_command("pippa_doctor", "--json", stdout=StringIO(), stderr=StringIO())
    out = StringIO()

    # The default grace period (an hour) does not apply to a written record.
    call_command("pippa_doctor", "--repair", "--json", stdout=out, stderr=StringIO())

    report = json.loads(out.getvalue())
    pending = next(f for f in report["findings"] if f["key"] == "pending_unlinks")
    assert (pending["found"], pending["repaired"], pending["remaining"]) == (5, 5, 0)
    assert report["clean"] is True
    assert_no_leftovers(killed_after_commit)


@pytest.mark.django_db(transaction=True)
def test_a_delete_removes_a_payload_blob_that_only_its_events_named(user):
    conversation, _ = conversation_with_everything(owner=user)
    loose = interrupted_snapshot(conversation)
    before = subtree_snapshot(conversation.pk)

    conversation_delete(conversation_id=conversation.pk)

    assert not default_store().exists(loose)
    assert_no_leftovers(before)


@pytest.mark.django_db(transaction=True)
def test_a_delete_keeps_a_payload_blob_another_task_is_still_resuming(
    user, make_conversation
):
    conversation, _ = conversation_with_everything(owner=user)
    loose = interrupted_snapshot(conversation)
    # Another conversation's open envelope names the same bytes.
    other = task_create(
        conversation=make_conversation(owner=user),
        title="same search",
        steps=[{"title": "search", "tool": "test.snapshot"}],
    )
    other_step = Step.objects.get(task=other)
    events_append(
        task_id=other.pk,
        entries=[
            ("tool_call_started", other_step.pk, {"class": 3, "generation": 0}),
            ("payload_persisted", other_step.pk, {"sha": loose, "generation": 0}),
        ],
    )

    conversation_delete(conversation_id=conversation.pk)

    assert default_store().exists(loose)
    assert not PendingUnlink.objects.exists()
