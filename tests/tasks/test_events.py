"""The event log: append-only, per-task sequence gap-free under concurrent writers."""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest

from tasks.models import Event, EventImmutable
from tasks.services import TaskNotFound, event_append, events_append
from tests.conftest import REPO


@pytest.mark.django_db
def test_appends_get_consecutive_sequence_numbers_per_task(make_task):
    a, b = make_task(), make_task()
    for _ in range(3):
        event_append(task_id=a.pk, kind="x")
    event_append(task_id=b.pk, kind="x")
    events_append(task_id=a.pk, entries=[("y", None, {}), ("z", None, {"n": 1})])
    assert list(Event.objects.filter(task=a).values_list("seq", "kind")) == [
        (1, "x"),
        (2, "x"),
        (3, "x"),
        (4, "y"),
        (5, "z"),
    ]
    assert list(Event.objects.filter(task=b).values_list("seq", flat=True)) == [1]


@pytest.mark.django_db
def test_saving_an_existing_event_is_refused_with_a_clear_error(make_task):
    event = event_append(task_id=make_task().pk, kind="x", data={"a": 1})
    event.kind = "rewritten"
    with pytest.raises(EventImmutable, match="append-only"):
        event.save()
    assert Event.objects.get(pk=event.pk).kind == "x"


@pytest.mark.django_db
def test_queryset_update_and_bulk_update_of_events_are_refused(make_task):
    event = event_append(task_id=make_task().pk, kind="x")
    with pytest.raises(EventImmutable, match="append-only"):
        Event.objects.filter(pk=event.pk).update(kind="y")
    event.kind = "y"
    with pytest.raises(EventImmutable, match="append-only"):
        Event.objects.bulk_update([event], ["kind"])
    assert Event.objects.get(pk=event.pk).kind == "x"


@pytest.mark.django_db
def test_deleting_events_on_their_own_is_refused(make_task):
    event = event_append(task_id=make_task().pk, kind="x")
    with pytest.raises(EventImmutable):
        event.delete()
    with pytest.raises(EventImmutable):
        Event.objects.all().delete()
    assert Event.objects.count() == 1


@pytest.mark.django_db
def test_appending_to_a_missing_task_fails_and_writes_nothing():
    with pytest.raises(TaskNotFound):
        event_append(task_id=424242, kind="x")
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_event_data_must_stay_small(make_task):
    task = make_task()
    with pytest.raises(ValueError, match="small"):
        event_append(task_id=task.pk, kind="x", data={"payload": "x" * 10_000})
    task.refresh_from_db()
    assert task.last_seq == 0
    assert not Event.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_processes_appending_at_once_get_unique_gap_free_sequences(
    make_task, subprocess_env, python_exe, tmp_path
):
    task = make_task()
    per_writer = 300
    go = tmp_path / "go"
    env = {**subprocess_env, "PIPPA_GO": str(go)}
    procs = [
        subprocess.Popen(
            [
                python_exe,
                "-m",
                "tests.support.append_events",
                str(task.pk),
                str(per_writer),
                label,
            ],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for label in ("A", "B")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.{x}.ready").exists() for x in "AB"):
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.01)
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    seqs = list(
        Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, 2 * per_writer + 1))
    writers = Counter(
        d["writer"]
        for d in Event.objects.filter(task=task).values_list("data", flat=True)
    )
    assert writers == {"A": per_writer, "B": per_writer}
    # The two writers really ran at the same time.
    (a0, a1), (b0, b1) = (
        map(float, (tmp_path / f"go.{x}.span").read_text().split()) for x in "AB"
    )
    assert max(a0, b0) < min(a1, b1)
    task.refresh_from_db()
    assert task.last_seq == 2 * per_writer
