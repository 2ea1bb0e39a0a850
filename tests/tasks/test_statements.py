"""Each named statement of the hot path does what its ORM spelling does.

One table: a statement of ``tasks.statements`` beside the ORM query a reader
would write for it. Both run on twin tasks set up alike, and the rows they
leave (and what they return) must agree.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F, Q
from django.utils import timezone

from tasks import statements as sql
from tasks.executor import step_row
from tasks.models import Step, Task, TaskArtifact
from tasks.plan import task_create

S, T = Step.Status, Task.Status
NOW = timezone.now()


def dt(value):
    return sql.db_datetime(value)


def first_open(task) -> Step:
    return (
        Step.objects.filter(task=task)
        .exclude(status__in=sql.FINISHED)
        .order_by("position")
        .first()
    )


def step_state(task) -> list:
    return [
        (
            s.position,
            s.status,
            s.attempts,
            s.error,
            s.output_id is not None,
            s.started_at is not None,
            s.finished_at is not None,
            s.next_attempt_at is not None,
        )
        for s in Step.objects.filter(task=task).order_by("position")
    ]


def task_state(task) -> tuple:
    t = Task.objects.get(pk=task.pk)
    return (
        t.status,
        t.lease_owner,
        t.lease_expires_at is not None,
        t.last_seq,
        t.steps_done,
        t.finished_at is not None,
    )


def links(task) -> list:
    return sorted(
        TaskArtifact.objects.filter(task=task).values_list("role", "step__position")
    )


# (name, set-up of both twins, the statement, its ORM spelling)
CASES = [
    (
        "STEP_NEXT",
        {},
        lambda c, t, a: step_row_id(
            c.execute(sql.STEP_NEXT, [t.pk, *sql.FINISHED]).fetchone()
        ),
        lambda t, a: first_open(t).pk,
    ),
    (
        "STEP_START_NEXT",
        {},
        lambda c, t, a: step_row_id(
            c.execute(
                sql.STEP_START_NEXT,
                [S.RUNNING, dt(NOW), t.pk, *sql.FINISHED, S.PENDING, dt(NOW), t.pk],
            ).fetchone()
        ),
        lambda t, a: start_next_orm(t),
    ),
    (
        "STEP_START_NEXT, not due yet",
        {"step": {"next_attempt_at": NOW + timedelta(days=1)}},
        lambda c, t, a: c.execute(
            sql.STEP_START_NEXT,
            [S.RUNNING, dt(NOW), t.pk, *sql.FINISHED, S.PENDING, dt(NOW), t.pk],
        ).fetchone(),
        lambda t, a: start_next_orm(t),
    ),
    (
        "STEP_START",
        {"step": {"status": S.NEEDS_REVIEW}},
        lambda c, t, a: run(c, sql.STEP_START, [S.RUNNING, dt(NOW), first_open(t).pk]),
        lambda t, a: (
            Step.objects.filter(pk=first_open(t).pk).update(
                status=S.RUNNING,
                attempts=F("attempts") + 1,
                started_at=NOW,
                finished_at=None,
                next_attempt_at=None,
            )
            and None
        ),
    ),
    (
        "STEP_FAIL",
        {},
        lambda c, t, a: run(c, sql.STEP_FAIL, [S.FAILED, dt(NOW), first_open(t).pk]),
        lambda t, a: (
            Step.objects.filter(pk=first_open(t).pk).update(
                status=S.FAILED, finished_at=NOW
            )
            and None
        ),
    ),
    (
        "STEP_ATTEMPT_FAILED",
        {},
        lambda c, t, a: run(
            c,
            sql.STEP_ATTEMPT_FAILED,
            [S.PENDING, "boom", dt(NOW), dt(NOW), first_open(t).pk],
        ),
        lambda t, a: (
            Step.objects.filter(pk=first_open(t).pk).update(
                status=S.PENDING, error="boom", finished_at=NOW, next_attempt_at=NOW
            )
            and None
        ),
    ),
    (
        "STEP_DONE",
        {"step": {"error": "old"}},
        lambda c, t, a: run(
            c, sql.STEP_DONE, [S.DONE, a.pk, dt(NOW), first_open(t).pk]
        ),
        lambda t, a: (
            Step.objects.filter(pk=first_open(t).pk).update(
                status=S.DONE, output=a, finished_at=NOW, error=""
            )
            and None
        ),
    ),
    (
        "STEP_NEEDS_REVIEW",
        {},
        lambda c, t, a: run(
            c, sql.STEP_NEEDS_REVIEW, [S.NEEDS_REVIEW, "needs you", first_open(t).pk]
        ),
        lambda t, a: (
            Step.objects.filter(pk=first_open(t).pk).update(
                status=S.NEEDS_REVIEW, error="needs you"
            )
            and None
        ),
    ),
    (
        "LINK_PERSISTED, twice",
        {},
        lambda c, t, a: [
            run(
                c,
                sql.LINK_PERSISTED,
                [a.pk, t.pk, first_open(t).pk, TaskArtifact.Role.PERSISTED, dt(NOW)],
            )
            for _ in range(2)
        ][0],
        lambda t, a: (
            [
                TaskArtifact.objects.get_or_create(
                    task=t,
                    artifact=a,
                    role=TaskArtifact.Role.PERSISTED,
                    defaults={"step": first_open(t)},
                )
                for _ in range(2)
            ]
            and None
        ),
    ),
    (
        "LEASE_READ",
        {"task": {"lease_owner": "w", "status": T.RUNNING}},
        lambda c, t, a: c.execute(sql.LEASE_READ, [t.pk]).fetchone()[:2],
        lambda t, a: Task.objects.values_list("status", "lease_owner").get(pk=t.pk),
    ),
    (
        "LEASE_TAKE of an expired lease",
        {
            "task": {
                "lease_owner": "old",
                "lease_expires_at": NOW - timedelta(days=1),
            }
        },
        lambda c, t, a: c.execute(
            sql.LEASE_TAKE,
            [
                "new",
                dt(NOW + timedelta(minutes=1)),
                T.RUNNING,
                dt(NOW),
                t.pk,
                "old",
                dt(NOW),
                T.QUEUED,
                T.RUNNING,
            ],
        ).fetchone(),
        lambda t, a: take_orm(t, previous="old"),
    ),
    (
        "LEASE_TAKE of a live lease",
        {
            "task": {
                "lease_owner": "old",
                "lease_expires_at": NOW + timedelta(days=1),
            }
        },
        lambda c, t, a: c.execute(
            sql.LEASE_TAKE,
            [
                "new",
                dt(NOW + timedelta(minutes=1)),
                T.RUNNING,
                dt(NOW),
                t.pk,
                "old",
                dt(NOW),
                T.QUEUED,
                T.RUNNING,
            ],
        ).fetchone(),
        lambda t, a: take_orm(t, previous="old"),
    ),
    (
        "LEASE_CLEAR_STOPPED of a paused task",
        {"task": {"lease_owner": "w", "lease_expires_at": NOW, "status": T.PAUSED}},
        lambda c, t, a: c.execute(
            sql.LEASE_CLEAR_STOPPED, [t.pk, "w", T.PAUSED, T.CANCELLED]
        ).fetchone(),
        lambda t, a: clear_stopped_orm(t, "w"),
    ),
    (
        "LEASE_CLEAR_STOPPED of a running task",
        {"task": {"lease_owner": "w", "lease_expires_at": NOW, "status": T.RUNNING}},
        lambda c, t, a: c.execute(
            sql.LEASE_CLEAR_STOPPED, [t.pk, "w", T.PAUSED, T.CANCELLED]
        ).fetchone(),
        lambda t, a: clear_stopped_orm(t, "w"),
    ),
    (
        "SEQS_GIVE_BACK",
        {"task": {"last_seq": 7}},
        lambda c, t, a: run(c, sql.SEQS_GIVE_BACK, [2, t.pk]),
        lambda t, a: (
            Task.objects.filter(pk=t.pk).update(last_seq=F("last_seq") - 2) and None
        ),
    ),
    (
        "SEQS_RESERVE, anyone's",
        {"task": {"last_seq": 3}},
        lambda c, t, a: one(c, sql.SEQS_RESERVE, [2, t.pk]),
        lambda t, a: reserve_orm(t, 2),
    ),
    (
        "LEASE_RENEW, the holder's renewal of a running task",
        {"task": {"last_seq": 3, "lease_owner": "w", "status": T.RUNNING}},
        lambda c, t, a: one(
            c, sql.LEASE_RENEW, [1, dt(NOW), dt(NOW), t.pk, "w", T.RUNNING]
        ),
        lambda t, a: reserve_orm(
            t,
            1,
            Q(lease_owner="w", status=T.RUNNING),
            lease_expires_at=NOW,
            updated_at=NOW,
        ),
    ),
    (
        "LEASE_RENEW of a queued task: nothing",
        {"task": {"lease_owner": "w", "status": T.QUEUED}},
        lambda c, t, a: one(
            c, sql.LEASE_RENEW, [1, dt(NOW), dt(NOW), t.pk, "w", T.RUNNING]
        ),
        lambda t, a: reserve_orm(t, 1, Q(lease_owner="w", status=T.RUNNING)),
    ),
    (
        "LEASE_RENEW_QUEUED, a queued task's renewal sets it running",
        {"task": {"lease_owner": "w", "status": T.QUEUED}},
        lambda c, t, a: one(
            c,
            sql.LEASE_RENEW_QUEUED,
            [0, dt(NOW), dt(NOW), T.RUNNING, t.pk, "w", T.QUEUED],
        ),
        lambda t, a: reserve_orm(
            t,
            0,
            Q(lease_owner="w", status=T.QUEUED),
            lease_expires_at=NOW,
            updated_at=NOW,
            status=T.RUNNING,
        ),
    ),
    (
        "SEQS_HELD, another worker's lease: nothing",
        {"task": {"lease_owner": "other", "status": T.RUNNING}},
        lambda c, t, a: one(c, sql.SEQS_HELD, [1, dt(NOW), dt(NOW), t.pk, "w"]),
        lambda t, a: reserve_orm(t, 1, Q(lease_owner="w")),
    ),
    (
        "SEQS_HELD, the holder's append renews the lease",
        {"task": {"lease_owner": "w", "status": T.RUNNING}},
        lambda c, t, a: one(c, sql.SEQS_HELD, [2, dt(NOW), dt(NOW), t.pk, "w"]),
        lambda t, a: reserve_orm(
            t, 2, Q(lease_owner="w"), updated_at=NOW, lease_expires_at=NOW
        ),
    ),
    (
        "SEQS_STEP_DONE, a result: the plan advances, the expiry stays",
        {"task": {"lease_owner": "w", "status": T.RUNNING, "lease_expires_at": NOW}},
        lambda c, t, a: one(c, sql.SEQS_STEP_DONE, [2, dt(NOW), t.pk, "w"]),
        lambda t, a: reserve_orm(
            t, 2, Q(lease_owner="w"), updated_at=NOW, steps_done=F("steps_done") + 1
        ),
    ),
    (
        "SEQS_STEP_DONE, another worker's lease: nothing",
        {"task": {"lease_owner": "other", "status": T.RUNNING}},
        lambda c, t, a: one(c, sql.SEQS_STEP_DONE, [2, dt(NOW), t.pk, "w"]),
        lambda t, a: reserve_orm(t, 2, Q(lease_owner="w")),
    ),
    (
        "LEASE_CLOSE, the holder's close: done",
        {"task": {"lease_owner": "w", "status": T.RUNNING, "lease_expires_at": NOW}},
        lambda c, t, a: one(
            c,
            sql.LEASE_CLOSE,
            [1, dt(NOW), *(T.CANCELLED,) * 2, T.DONE, T.CANCELLED, dt(NOW), t.pk, "w"],
        ),
        lambda t, a: close_orm(t, T.DONE, NOW, (T.CANCELLED,)),
    ),
    (
        "LEASE_CLOSE, the holder's re-queue keeps a person's pause",
        {"task": {"lease_owner": "w", "status": T.PAUSED}},
        lambda c, t, a: one(
            c,
            sql.LEASE_CLOSE,
            [1, dt(NOW), T.CANCELLED, T.PAUSED, T.QUEUED, T.CANCELLED, None, t.pk, "w"],
        ),
        lambda t, a: close_orm(t, T.QUEUED, None, (T.CANCELLED, T.PAUSED)),
    ),
    (
        "LEASE_CLOSE of another worker's lease: nothing",
        {"task": {"lease_owner": "other", "status": T.RUNNING}},
        lambda c, t, a: one(
            c,
            sql.LEASE_CLOSE,
            [1, dt(NOW), *(T.CANCELLED,) * 2, T.DONE, T.CANCELLED, dt(NOW), t.pk, "w"],
        ),
        lambda t, a: reserve_orm(t, 1, Q(lease_owner="w")),
    ),
]


def one(cur, statement: str, params):
    """A statement with RETURNING: its first row, or None."""
    cur.execute(statement, params)
    return cur.fetchone()


def run(cur, statement: str, params) -> None:
    """A statement with no RETURNING: run it; it answers nothing."""
    cur.execute(statement, params)


def step_row_id(values):
    return None if values is None else step_row(0, values).id


def start_next_orm(task):
    nxt = first_open(task)
    updated = (
        Step.objects.filter(pk=nxt.pk, status=S.PENDING, attempts__lt=F("max_attempts"))
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=NOW))
        .update(
            status=S.RUNNING,
            attempts=F("attempts") + 1,
            started_at=NOW,
            finished_at=None,
            next_attempt_at=None,
        )
    )
    return nxt.pk if updated else None


def take_orm(task, *, previous):
    updated = (
        Task.objects.lease_dead()
        .filter(pk=task.pk, lease_owner=previous, status__in=[T.QUEUED, T.RUNNING])
        .update(
            lease_owner="new",
            lease_expires_at=NOW + timedelta(minutes=1),
            status=T.RUNNING,
            updated_at=NOW,
        )
    )
    if not updated:
        return None
    return tuple(Task.objects.values_list("steps_total", "steps_done").get(pk=task.pk))


def clear_stopped_orm(task, holder):
    rows = Task.objects.filter(
        pk=task.pk, lease_owner=holder, status__in=[T.PAUSED, T.CANCELLED]
    )
    status = rows.values_list("status", flat=True).first()
    rows.update(lease_owner="", lease_expires_at=None)
    return None if status is None else (status,)


def reserve_orm(task, count, where: Q | None = None, **changes):
    rows = Task.objects.filter(where or Q(), pk=task.pk)
    if not rows.update(last_seq=F("last_seq") + count, **changes):
        return None
    return Task.objects.get(pk=task.pk).last_seq


def close_orm(task, status, finished, kept):
    rows = Task.objects.filter(pk=task.pk, lease_owner="w")
    current = rows.get()
    changes = {
        "last_seq": F("last_seq") + 1,
        "updated_at": NOW,
        "lease_owner": "",
        "lease_expires_at": None,
    }
    if current.status not in kept:
        changes["status"] = status
    if current.status != T.CANCELLED:
        changes["finished_at"] = finished
    rows.update(**changes)
    return Task.objects.get(pk=task.pk).last_seq


@pytest.fixture
def twins(make_conversation, make_artifact, tool_log):
    conversation = make_conversation()
    plan = [{"title": f"fetch {n}", "tool": "test.fetch"} for n in range(3)]
    made = []
    for name in ("statement", "orm"):
        task = task_create(conversation=conversation, title=name, steps=plan)
        made.append(task)
    artifact = make_artifact(owner=conversation.owner)
    return made, artifact


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "setup", "statement", "orm"), CASES, ids=[c[0] for c in CASES]
)
def test_each_statement_leaves_the_rows_its_orm_spelling_leaves(
    twins, name, setup, statement, orm
):
    (raw_task, orm_task), artifact = twins
    for task in (raw_task, orm_task):
        if "task" in setup:
            Task.objects.filter(pk=task.pk).update(**setup["task"])
        if "step" in setup:
            Step.objects.filter(pk=first_open(task).pk).update(**setup["step"])
    assert task_state(raw_task) == task_state(orm_task)

    got = statement(sql.cursor(), raw_task, artifact)
    expected = orm(orm_task, artifact)

    if isinstance(got, tuple) and isinstance(expected, int):
        got = got[0]
    if name.startswith(("STEP_NEXT", "STEP_START_NEXT")) and expected is not None:
        # Twin tasks: the same position, another id.
        got = Step.objects.get(pk=got).position
        expected = Step.objects.get(pk=expected).position
    assert got == (expected if not isinstance(got, tuple) else tuple(expected))
    assert step_state(raw_task) == step_state(orm_task), name
    assert task_state(raw_task) == task_state(orm_task), name
    assert links(raw_task) == links(orm_task), name


def test_no_status_is_spelled_in_the_statements():
    """Statuses are parameters bound from the models' TextChoices."""
    texts = [
        value
        for key, value in vars(sql).items()
        if key.isupper() and isinstance(value, str) and " " in value
    ]
    assert len(texts) > 10
    spelled = {
        status
        for text in texts
        for status in [*S.values, *T.values]
        if f"'{status}'" in text
    }
    assert spelled == set()
