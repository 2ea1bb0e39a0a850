"""Small step outputs kept in the database: same guarantees as a blob file, no file.

A step's output of at most ``PIPPA_INLINE_MAX_BYTES`` is an ``InlineBlob`` row
written in the transaction that commits its ``payload_persisted`` event; larger
outputs and class-1 files stay files. Readers, GC, deletion, the doctor and
resume treat both alike.
"""

from __future__ import annotations

import hashlib

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from artifacts.models import Artifact, ArtifactClass, InlineBlob
from artifacts.services import artifact_insert
from artifacts.store import default_store
from tasks.doctor import _integrity_scan, doctor_run
from tasks.executor import step
from tasks.models import Event, Step
from tasks.plan import task_create
from tasks.services import conversation_delete
from tasks.tools import tools_load
from tests.support.blobs import blob_overwrite
from tests.support.executing import (
    check_invariants,
    crash_at,
    expire_lease,
    invocations,
    run_task,
)
from tests.support.leftovers import assert_no_leftovers

pytestmark = pytest.mark.usefixtures("tool_log")  # the test tools, logged


def fetch_task(conversation, *sizes: int):
    return task_create(
        conversation=conversation,
        title="fetches",
        steps=[
            {"title": f"fetch {n}", "tool": "test.fetch", "args": {"size": size}}
            for n, size in enumerate(sizes)
        ],
    )


def blob_files() -> list[str]:
    return [sha for sha, _ in default_store().iter_files()]


@pytest.mark.django_db
def test_a_small_output_is_a_row_committed_with_its_event_and_no_file(
    make_conversation, settings
):
    settings.PIPPA_INLINE_MAX_BYTES = 1024
    task = fetch_task(make_conversation(), 1024)

    outcome = step(task_id=task.pk, worker_id="w")

    sha = outcome.artifact["sha256"]
    assert blob_files() == []
    row = InlineBlob.objects.get()
    assert (row.sha256, row.size) == (sha, 1024)
    assert hashlib.sha256(bytes(row.data)).hexdigest() == sha
    payload = Event.objects.get(task=task, kind="payload_persisted")
    assert payload.data["stored"] == "inline"
    assert payload.data["sha"] == sha
    store = default_store()
    assert store.exists(sha)
    assert store.verify(sha)
    assert store.size(sha) == 1024
    assert store.get(sha) == bytes(row.data)
    assert Artifact.objects.get(pk=outcome.artifact["id"]).integrity == "ok"
    check_invariants([task.pk])


@pytest.mark.django_db
def test_one_byte_over_the_limit_and_class_1_files_stay_files(
    make_conversation, settings
):
    settings.PIPPA_INLINE_MAX_BYTES = 1024
    big = fetch_task(make_conversation(), 1025)
    run_task(big.pk)
    files = task_create(
        conversation=make_conversation(),
        title="file",
        steps=[{"title": "file", "tool": "test.file", "args": {"size": 10}}],
    )
    run_task(files.pk)

    assert not InlineBlob.objects.exists()
    outputs = set(Step.objects.values_list("output__sha256", flat=True))
    assert set(blob_files()) == outputs
    assert not Event.objects.filter(data__stored="inline").exists()


@pytest.mark.django_db
def test_a_limit_of_zero_stores_every_output_as_a_file(make_conversation, settings):
    settings.PIPPA_INLINE_MAX_BYTES = 0
    task = fetch_task(make_conversation(), 1, 100)
    run_task(task.pk)
    assert not InlineBlob.objects.exists()
    assert len(blob_files()) == 2


@pytest.mark.django_db
def test_a_crash_after_the_payload_commit_adopts_the_inline_bytes_without_a_call(
    make_conversation, tool_log
):
    # A snapshot (class 3) gives new bytes on every call: adopting the saved
    # ones is the only way its output can equal what the dead worker saved.
    task = task_create(
        conversation=make_conversation(),
        title="snapshots",
        steps=[
            {"title": f"snap {n}", "tool": "test.snapshot", "args": {"size": 300}}
            for n in range(2)
        ],
    )
    crash_at(task.pk, "after_payload:1")
    saved = Event.objects.get(task=task, kind="payload_persisted").data["sha"]
    expire_lease(task.pk)

    outcomes = run_task(task.pk, worker_id="fresh")

    first = Step.objects.get(task=task, position=1)
    assert outcomes[0].rule
    assert not outcomes[0].invoked
    assert first.output.sha256 == saved
    assert invocations(tool_log, "test.snapshot")[first.pk] == 1
    assert InlineBlob.objects.filter(sha256=saved).exists()
    check_invariants([task.pk])


@pytest.mark.django_db
def test_a_payload_commit_that_fails_leaves_no_inline_row_and_no_pending_unlink(
    make_conversation, monkeypatch
):
    task = fetch_task(make_conversation(), 200)
    store = default_store()
    real = store.put_inline

    def full(data, sha=None):
        real(data, sha=sha)  # the row is written, then the commit fails
        raise OperationalError("database or disk is full")

    monkeypatch.setattr(type(store), "put_inline", staticmethod(full))

    outcome = step(task_id=task.pk, worker_id="w")

    assert outcome.fault == "disk full"
    assert not InlineBlob.objects.exists()
    assert not Event.objects.filter(kind="payload_persisted").exists()
    assert blob_files() == []
    monkeypatch.undo()
    tools_load(["tests.support.tools"])
    expire_lease(task.pk)
    run_task(task.pk, worker_id="later")
    assert Step.objects.get(task=task).status == "done"
    assert InlineBlob.objects.count() == 1
    check_invariants([task.pk])


@pytest.mark.django_db
def test_two_owners_share_one_inline_row_which_goes_with_the_last_of_them(
    make_user, make_conversation, django_capture_on_commit_callbacks
):
    # The same bytes: test.fetch is stable per (task, step, generation) text,
    # so make the two outputs equal through the step text itself.
    ann, bob = make_user(username="ann"), make_user(username="bob")
    conversations = [make_conversation(owner=ann), make_conversation(owner=bob)]
    tasks = [
        task_create(
            conversation=c,
            title="same",
            steps=[{"title": "s", "tool": "demo.closes", "args": {}}],
        )
        for c in conversations
    ]
    for task in tasks:
        run_task(task.pk)
    shas = {Step.objects.get(task=t).output.sha256 for t in tasks}
    assert len(shas) == 1
    (sha,) = shas
    assert Artifact.objects.filter(sha256=sha).count() == 2  # one row per owner
    assert InlineBlob.objects.filter(sha256=sha).count() == 1  # one copy of the bytes

    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=conversations[0].pk)
    assert InlineBlob.objects.filter(sha256=sha).exists()
    assert default_store().get(sha)  # bob still reads his output
    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=conversations[1].pk)
    assert not InlineBlob.objects.exists()
    assert_no_leftovers()


@pytest.mark.django_db
def test_the_doctor_sweeps_an_unnamed_inline_row_and_flags_a_corrupt_one(
    make_conversation,
):
    task = fetch_task(make_conversation(), 100)
    run_task(task.pk)
    kept = Step.objects.get(task=task).output
    stray = default_store().put_inline(b"nobody names these bytes")

    report = doctor_run(repair=True, grace_seconds=0)
    assert report.finding("orphan_blobs").found == 1
    assert not InlineBlob.objects.filter(sha256=stray.sha256).exists()
    assert InlineBlob.objects.filter(sha256=kept.sha256).exists()

    blob_overwrite(kept.sha256, b"x" * 100)  # same size, wrong bytes
    report = doctor_run(repair=True, grace_seconds=0, verify=True)
    kept.refresh_from_db()
    assert kept.integrity == "corrupt"
    assert InlineBlob.objects.filter(sha256=kept.sha256).exists()  # never deleted


def inline_artifact(owner, data: bytes) -> int:
    """An artifact row over bytes kept inline, as the executor writes one."""
    put = default_store().put_inline(data)
    return artifact_insert(
        owner_id=owner.pk,
        sha256=put.sha256,
        size=put.size,
        media_type="text/plain",
        artifact_class=ArtifactClass.SNAPSHOT,
        inline=True,
    ).id


def integrity_scan(verify: bool = True) -> dict[int, str]:
    damaged, _ = _integrity_scan(
        default_store(), verify=verify, progress=lambda _: None
    )
    return damaged


@pytest.mark.django_db
def test_the_integrity_scan_reads_inline_blobs_together_not_a_query_each(make_user):
    owner = make_user(username="many-inline")
    counts = []
    for n in (3, 40):
        Artifact.objects.all().delete()
        for i in range(n):
            inline_artifact(owner, f"inline bytes {n}:{i}".encode())
        with CaptureQueriesContext(connection) as queries:
            assert integrity_scan() == {}
        counts.append(len(queries))
    assert counts[0] == counts[1]


@pytest.mark.django_db
def test_the_integrity_scan_finds_a_missing_and_a_resized_inline_blob(make_user):
    owner = make_user(username="damaged-inline")
    gone, shrunk, whole = (
        inline_artifact(owner, data)
        for data in (b"will vanish", b"will shrink", b"stays whole")
    )
    sha = dict(Artifact.objects.values_list("pk", "sha256"))
    InlineBlob.objects.filter(sha256=sha[gone]).delete()
    InlineBlob.objects.filter(sha256=sha[shrunk]).update(size=3, data=b"wil")

    for verify in (False, True):
        damaged = integrity_scan(verify)
        assert damaged == {gone: "missing", shrunk: "corrupt"}, verify
        assert whole not in damaged


@pytest.mark.django_db
def test_an_inline_output_downloads_for_its_owner_only(
    client, make_user, make_conversation
):
    owner, other = make_user(username="owner"), make_user(username="other")
    task = fetch_task(make_conversation(owner=owner), 64)
    run_task(task.pk)
    artifact = Step.objects.get(task=task).output
    url = reverse("artifacts:source", args=[artifact.pk])

    client.force_login(owner)
    response = client.get(url)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == default_store().get(artifact.sha256)

    client.force_login(other)
    assert client.get(url).status_code == 404


@pytest.mark.django_db
def test_a_pages_heads_come_from_files_and_inline_rows_in_one_query(
    make_conversation, settings, django_assert_num_queries
):
    task = fetch_task(make_conversation(), 40, 50)
    run_task(task.pk)
    inline = [s.output.sha256 for s in Step.objects.filter(task=task)]
    file = default_store().put_bytes(b"a file's bytes, longer than the head")
    missing = "0" * 64

    with django_assert_num_queries(1):
        heads = default_store().heads([*inline, file.sha256, missing], 10)

    assert heads[file.sha256] == b"a file's b"
    assert {sha: len(h) for sha, h in heads.items() if sha in inline} == dict.fromkeys(
        inline, 10
    )
    assert all(default_store().get(sha)[:10] == heads[sha] for sha in inline)
    assert missing not in heads


@pytest.mark.django_db
def test_the_doctor_keeps_the_saved_output_a_person_is_asked_about(make_conversation):
    task = task_create(
        conversation=make_conversation(),
        title="notify",
        steps=[{"title": "notify", "tool": "test.effect", "args": {}}],
    )
    crash_at(task.pk, "after_payload:0")
    expire_lease(task.pk)
    assert step(task_id=task.pk, worker_id="fresh").status == "needs_review"
    saved = Event.objects.get(task=task, kind="payload_persisted").data["sha"]

    report = doctor_run(repair=True, grace_seconds=0)

    assert report.finding("orphan_blobs").found == 0
    assert InlineBlob.objects.filter(sha256=saved).exists()  # "Use the saved output"
