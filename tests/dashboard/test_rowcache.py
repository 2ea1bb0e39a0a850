"""The rows cache: settled step rows drawn once, by the same partial, never stale.

``dashboard.rowcache`` keys an event row on the values of every path its
partial reads (``EVENT_ROW_READS``), and a step row on what it is made from
(``StepRow.sources``: every column of its step and its output, its last
event, whether its file is there), to which every ``row.`` path the partial
reads is held (``STEP_ROW_MADE_OF``). The recording tests below draw each
partial with a context that logs each read and fail on any path not in the
kind's list (or the late paths, drawn in after the rows), or on a kept row
that reads the clock; the write tests change every column and see the row
drawn again.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.core.cache import caches
from django.template import Context, TemplateSyntaxError
from django.template.base import PartialTemplate
from django.template.loader import get_template
from django.test import Client
from django.utils import timezone

from artifacts.models import Artifact
from artifacts.store import default_store
from dashboard import rowcache
from dashboard.selectors import timeline
from dashboard.selectors.events import task_events
from dashboard.selectors.timeline import task_timeline
from tasks import actions
from tasks.executor import step as executor_step
from tasks.models import Step, Task
from tasks.plan import task_create
from tasks.services import event_append
from tests.support.executing import expire_lease
from tests.tasks.dashboard_data import add_steps

pytestmark = pytest.mark.django_db

WORKER = "worker:test-rows"


@pytest.fixture(autouse=True)
def _empty_rows_cache():
    caches[rowcache.ALIAS].clear()
    yield
    caches[rowcache.ALIAS].clear()


@pytest.fixture
def drawn(monkeypatch) -> list[int]:
    """The step ids whose row the ``step-row`` partial drew, in order (and
    minus the ids of the events whose ``event-row`` it drew)."""
    ids: list[int] = []
    render = PartialTemplate.render

    def spy(self, context):
        if self.name == "step-row":
            ids.append(context["row"].step.pk)
        elif self.name == "event-row":
            ids.append(-context["e"].pk)  # events as negative ids
        return render(self, context)

    monkeypatch.setattr(PartialTemplate, "render", spy)
    return ids


def _run(task: Task, times: int) -> Task:
    for _ in range(times):
        executor_step(task_id=task.pk, worker_id=WORKER)
    expire_lease(task.pk)  # the worker is gone: Dad may act
    task.refresh_from_db()
    return task


MASKS = [
    (re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"'), "csrf"),
    (re.compile(r'"x-csrftoken": "[^"]+"'), "csrf"),
    (re.compile(r'nonce="[^"]+"'), "nonce"),
    (re.compile(r"(just now|(in )?\d+ (s|min|h)( \d+ min)?( ago)?)"), "when"),
    # The task's clock, while it runs to now: its sentence and the axis note
    # (each drawn only once the clock has moved, so two draws a moment apart
    # may differ in whether they are there at all; they are not rows), the
    # axis and the bars reaching it.
    (re.compile(r'<p class="clock">.*?</p>', re.S), "clock"),
    (re.compile(r'<p id="axis-note"[^>]*>.*?</p>', re.S), "clock"),
    (re.compile(r"<strong>[\d.]+ (ms|s)</strong>"), "clock"),
    (re.compile(r"\([\d.]+ (ms|s)\)"), "clock"),
    (re.compile(r'data-axis="\d+"'), "clock"),
    (re.compile(r'viewBox="0 0 \d+ 14"'), "clock"),
]


def _masked(body: str) -> str:
    for pattern, word in MASKS:
        body = pattern.sub(word, body)
    return body


def _page(client, task: Task) -> str:
    """The task page with its event log open (``?kind=``), as the fold shows it."""
    response = client.get(task.get_absolute_url(), {"kind": ""})
    assert response.status_code == 200
    return response.content.decode()


def _row(body: str, position: int) -> str:
    row = body[body.index(f'id="step-{position}"') :]
    return row[: row.index("</li>")]


def _fresh(client, task: Task) -> str:
    """The page as drawn with an empty cache."""
    caches[rowcache.ALIAS].clear()
    return _page(client, task)


# -- served from the cache ----------------------------------------------------


def test_a_settled_row_is_served_from_the_cache_on_the_second_render(
    dad_client, fetch_task, drawn
):
    task = _run(fetch_task(), 3)
    assert task.status == Task.Status.DONE
    first = _page(dad_client, task)
    ids = list(task.steps.order_by("position").values_list("pk", flat=True))
    assert [i for i in drawn if i > 0] == ids
    assert len([i for i in drawn if i < 0]) == min(task.last_seq, 50)
    drawn.clear()
    again = _page(dad_client, task)
    assert drawn == []  # every row came from the cache, step and event
    assert _masked(again) == _masked(first)


def test_the_page_with_the_cache_is_byte_identical_to_the_page_without_it(
    dad_client, fetch_task, settings
):
    task = _run(fetch_task(4), 2)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    task.refresh_from_db()
    _page(dad_client, task)  # fills the cache
    hit = _page(dad_client, task)
    settings.CACHES = {
        **settings.CACHES,
        rowcache.ALIAS: {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
    }
    without = _page(dad_client, task)
    assert _masked(hit) == _masked(without)
    assert "Change course after step 1…" in hit


def test_a_running_step_is_never_cached(dad_client, fetch_task, drawn, monkeypatch):
    task = _run(fetch_task(), 1)
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner=WORKER,
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    task.steps.filter(position=2).update(
        status="running", attempts=1, started_at=timezone.now() - timedelta(seconds=9)
    )
    running = task.steps.get(position=2).pk
    later = task.steps.get(position=3).pk
    done = task.steps.get(position=1).pk
    # The clock stands still, so the row's own values do not move either:
    # only the rule that a running step is never kept draws it again.
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)
    for n in range(3):
        drawn.clear()
        body = _page(dad_client, task)
        assert running in drawn
        # A settled row of a running task is kept all the same, and so is a
        # later step's that was never tried.
        assert (done in drawn) == (n == 0)
        assert (later in drawn) == (n == 0)
        assert n == 0 or not [i for i in drawn if i < 0]  # the events are kept
        assert re.search(r"· started \d+ s ago", _row(body, 2))


def test_kept_rows_of_a_running_task_take_the_axis_as_it_grows(
    dad_client, fetch_task, drawn, monkeypatch
):
    """The axis reaches now while a task runs: every row's bars are drawn on
    the page's own axis, the kept ones too, and no stand-in is left."""
    task = _run(fetch_task(), 2)
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner=WORKER,
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    done = set(task.steps.filter(status="done").values_list("pk", flat=True))
    assert len(done) == 2
    now = timezone.now()
    axes = []
    for later in (5, 65):
        monkeypatch.setattr(
            timezone, "now", lambda later=later: now + timedelta(seconds=later)
        )
        drawn.clear()
        body = _page(dad_client, task)
        axis = re.search(r'data-axis="(\d+)"', body).group(1)
        boxes = re.findall(r'viewBox="0 0 (\d+) 14"', body)
        assert boxes == [axis, axis]  # the two done rows' bars
        assert "pippa-late" not in body
        axes.append(int(axis))
        if later == 65:
            assert done.isdisjoint(drawn)  # both rows came from the cache
    assert axes[1] - axes[0] == 60_000


def test_a_row_with_times_relative_to_now_is_never_cached(
    dad_client, fetch_task, drawn
):
    task = _run(fetch_task(), 3)
    done = task.steps.get(position=1)
    actions_row = task_timeline(task=task)[1][0]
    assert not actions_row.shows_attempts
    # A step a person skipped shows who did it and when ("5 min ago").
    failed = add_steps(task, 1, status=Step.Status.FAILED)[-1]
    actions.step_resolve(step=failed, action="skip", actor="user:dad")
    drawn.clear()
    _page(dad_client, task)
    _page(dad_client, task)
    assert drawn.count(failed.pk) == 2
    assert drawn.count(done.pk) == 1


# -- never stale ------------------------------------------------------------------


def _edit_title(task: Task) -> str:
    Step.objects.filter(task=task, position=1).update(title="Fetch one, renamed")
    return "Fetch one, renamed"


def _edit_output(task: Task) -> str:
    output = task.steps.get(position=1).output
    Artifact.objects.filter(pk=output.pk).update(title="closes, renamed")
    return "closes, renamed"


def _task_resumed(task: Task) -> str:
    Task.objects.filter(pk=task.pk).update(status=Task.Status.QUEUED)
    return "not started"


@pytest.mark.parametrize("write", [_edit_title, _edit_output])
def test_a_settled_row_changes_as_soon_as_what_it_shows_changes(
    dad_client, fetch_task, write
):
    task = _run(fetch_task(), 3)
    before = _page(dad_client, task)
    words = write(task)
    assert words not in before
    after = _page(dad_client, task)
    assert words in _row(after, 1)
    assert _masked(after) == _masked(_fresh(dad_client, task))


def test_rows_follow_the_executor_and_dads_actions(
    dad_client, conversation, settings, tool_log
):
    """Every write path: each page equals the one drawn with an empty cache."""
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    task = task_create(
        conversation=conversation,
        title="Fetches",
        steps=[
            {"title": "Fetch 1", "tool": "demo.closes", "args": {}},
            {"title": "Flaky", "tool": "test.flaky", "args": {"fail_times": 9}},
            {"title": "Fetch 3", "tool": "demo.closes", "args": {}},
        ],
    )
    _page(dad_client, task)

    def check() -> str:
        _page(dad_client, task)  # shows an action's message once
        body = _page(dad_client, task)
        assert _masked(body) == _masked(_fresh(dad_client, task))
        return body

    def run_until(status: str) -> None:
        for _ in range(10):
            if task.steps.get(position=2).status == status:
                return
            _run(task, 1)
            check()
        raise AssertionError(f"step 2 never became {status}")

    _run(task, 1)  # the executor: step 1 done
    assert 'class="badge status-done"' in _row(check(), 1)
    run_until(Step.Status.FAILED)  # the executor's failed attempts
    assert 'class="step step-failed" id="step-2"' in check()
    actions.step_retry(step=task.steps.get(position=2), actor="user:dad")
    assert 'class="badge status-pending"' in _row(check(), 2)
    run_until(Step.Status.FAILED)
    actions.step_resolve(
        step=task.steps.get(position=2), action="skip", actor="user:dad"
    )
    assert 'class="badge status-skipped"' in _row(check(), 2)
    _run(task, 1)
    assert 'class="badge status-done"' in _row(check(), 3)


def test_an_admin_decision_redraws_the_row(
    staff_client, operator, make_conversation, fetch_task
):
    task = fetch_task(conversation=make_conversation(owner=operator))
    task = _run(task, 1)
    Step.objects.filter(task=task, position=2).update(
        status=Step.Status.NEEDS_REVIEW, attempts=1
    )
    Task.objects.filter(pk=task.pk).update(status=Task.Status.NEEDS_REVIEW)
    before = _page(staff_client, task)
    assert 'class="step step-needs_review"' in before
    from django.urls import reverse

    step2 = task.steps.get(position=2)
    url = reverse("admin:tasks_step_resolve", args=[step2.pk])
    staff_client.post(url, {"action": "skip", "confirm": "yes"})
    step2.refresh_from_db()
    assert step2.status == Step.Status.SKIPPED
    _page(staff_client, task)  # shows the admin's message once
    after = _page(staff_client, task)
    assert 'class="badge status-skipped"' in _row(after, 2)
    assert _masked(after) == _masked(_fresh(staff_client, task))


def test_rows_of_a_task_that_moves_on_lose_their_branch_link(dad_client, fetch_task):
    task = _run(fetch_task(), 2)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    assert "Change course after step 1…" in _page(dad_client, task)
    _task_resumed(task)
    assert "Change course after step" not in _page(dad_client, task)


def _changed(field, value):
    """Another valid value for ``field`` than ``value``."""
    if field.choices:
        return next(c for c, _ in field.choices if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1000 if field.name == "position" else value + 1
    if isinstance(value, datetime):
        return value + timedelta(seconds=1)
    if value is None and field.get_internal_type() == "DateTimeField":
        return timezone.now() - timedelta(hours=1)
    if isinstance(value, dict):
        return {**value, "changed": 1}
    if isinstance(value, str) and len(value) == field.max_length:  # a sha
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    if isinstance(value, str):
        return value + "x"
    raise AssertionError(f"no other value for {field.name}: {value!r}")


def _columns(model, skip):
    return [
        f
        for f in model._meta.concrete_fields
        if not f.primary_key and f.name not in skip
    ]


# Keys to other rows: the output is another artifact's row (the test below).
STEP_SKIP = {"task", "output"}
OUTPUT_SKIP = {"owner"}


@pytest.mark.parametrize(
    ("model", "name"),
    [(Step, f.name) for f in _columns(Step, STEP_SKIP)]
    + [(Artifact, f.name) for f in _columns(Artifact, OUTPUT_SKIP)],
)
def test_a_kept_row_is_drawn_again_after_a_write_to_any_column(
    dad_client, fetch_task, drawn, model, name
):
    """Every column of the step and of its output, written behind the ORM's
    back (``update``: no save, no signal, as the executor's own statements
    and the admin's bulk actions write): the row is drawn again, and the
    page equals one drawn with an empty cache."""
    task = _run(fetch_task(), 3)
    step = task.steps.get(position=2)
    _page(dad_client, task)
    drawn.clear()
    _page(dad_client, task)
    assert step.pk not in drawn  # kept
    field = model._meta.get_field(name)
    row = step if model is Step else step.output
    value = _changed(field, getattr(row, field.attname))
    model.objects.filter(pk=row.pk).update(**{field.attname: value})
    drawn.clear()
    after = _page(dad_client, task)
    assert step.pk in drawn
    assert _masked(after) == _masked(_fresh(dad_client, task))


def test_a_kept_row_is_drawn_again_when_its_step_gets_an_event_or_another_output(
    dad_client, fetch_task, drawn
):
    task = _run(fetch_task(), 3)
    one, two = task.steps.get(position=1), task.steps.get(position=2)
    other = add_steps(task, 1, done=1)[-1].output  # another task's output, say
    _page(dad_client, task)
    # An event alone (its columns unchanged): a note of a person's skip.
    event_append(
        task_id=task.pk, kind="step_skipped", step_id=one.pk, data={"actor": "user:dad"}
    )
    Step.objects.filter(pk=two.pk).update(output=other)
    drawn.clear()
    after = _page(dad_client, task)
    assert {one.pk, two.pk} <= set(drawn)
    assert "what people did" in _row(after, 1)  # its notes unfold
    assert f"/artifacts/{other.pk}/" in _row(after, 2)
    assert _masked(after) == _masked(_fresh(dad_client, task))


def test_a_kept_row_whose_file_goes_away_is_drawn_again_as_missing(
    dad_client, fetch_task, drawn
):
    task = _run(fetch_task(), 3)
    step = task.steps.get(position=2)
    before = _page(dad_client, task)
    assert '<pre class="excerpt"' in _row(before, 2)
    default_store().path(step.output.sha256).unlink()
    drawn.clear()
    after = _page(dad_client, task)
    assert step.pk in drawn
    assert "The saved file for this output is missing." in _row(after, 2)


def test_a_file_gone_between_its_stat_and_its_read_is_not_kept_under_the_old_key(
    dad_client, fetch_task, monkeypatch
):
    """The key says the file is there (its stat), the read finds it gone: the
    row is drawn as missing but not kept under a key that says "there", so
    once the file is back the row shows it again."""
    task = _run(fetch_task(), 3)
    step = task.steps.get(position=2)
    path = default_store().path(step.output.sha256)
    saved = path.read_bytes()
    store = type(default_store())
    states = store.states

    def stat_says_there(self, shas, *, verify):
        shas = list(shas)
        found = states(self, shas, verify=verify)
        return {**found, step.output.sha256: (len(saved), True)}

    path.unlink()
    with monkeypatch.context() as m:
        m.setattr(store, "states", stat_says_there)
        raced = _page(dad_client, task)
    assert "The saved file for this output is missing." in _row(raced, 2)
    path.write_bytes(saved)
    back = _page(dad_client, task)
    assert '<pre class="excerpt"' in _row(back, 2)
    assert _masked(back) == _masked(_fresh(dad_client, task))


def test_a_page_of_kept_rows_reads_none_of_their_files_or_events(
    dad_client, fetch_task, monkeypatch
):
    """What the cache saves: a row it serves is not read beyond its step's
    row (no file's first bytes, none of its events, no bars)."""
    task = _run(fetch_task(), 3)
    _page(dad_client, task)
    read: list[int] = []
    later = timeline._read_later

    def spy(rows, clock):
        read.extend(row.step.pk for row in rows)
        return later(rows, clock)

    monkeypatch.setattr(timeline, "_read_later", spy)
    heads = []
    monkeypatch.setattr(
        type(default_store()),
        "heads",
        lambda self, shas, size: heads.append(shas) or {},
    )
    body = _page(dad_client, task)
    last = task.steps.get(position=3)  # the result card's, drawn large: read
    assert read == [last.pk]
    assert [list(shas) for shas in heads] == [[last.output.sha256]]
    assert '<pre class="excerpt"' in _row(body, 1)  # as drawn the first time
    # A row asked for what it did not read reads it then, with its list.
    read.clear()
    _, rows, _ = task_timeline(task=task)
    assert read == []
    assert rows[0].attempts[0].outcome == "done"
    assert sorted(read) == sorted(row.step.pk for row in rows)


def test_the_late_parts_conditions_read_only_the_page_and_each_part_is_held_whole(
    fetch_task,
):
    task, rows, clock = _rows_of_every_kind(fetch_task)
    partial = get_template("dashboard/task_detail.html#step-row").template
    parts = rowcache.late_parts(partial)
    assert len(parts) == 2  # the live update's hx-swap-oob, the branch link
    done = [row for row in rows if row.step.status == Step.Status.DONE]
    for row in rows:
        for oob in (False, True):
            values = {"row": row, "task": task, "clock": clock, "oob": oob}
            reads = Reads()
            context = RecordingContext(
                {key: _wrap(value, key, reads) for key, value in values.items()},
                reads,
            )
            for part in parts:
                part.holds(context)
            # Read once for the list: nothing of the row, no {% with %} name.
            assert {path.split(".")[0] for path in reads.paths} <= {"task", "oob"}
            assert reads.missing == set()
            with rowcache.drawing_rows():
                kept = partial.render(Context(values))
            # A kept row holds its parts drawn, whatever their conditions.
            assert kept.count(parts[0].opener) == kept.count(parts[0].closer) == 1
            branch = row in done and row.step.position < task.steps_total
            assert kept.count(parts[1].opener) == kept.count(parts[1].closer) == branch
            if branch:
                assert f"Change course after step {row.step.position}…" in kept
    assert any(row.step.position < task.steps_total for row in done)


@pytest.mark.parametrize("oob", [False, True])
@pytest.mark.parametrize("idle", [False, True])
def test_a_kept_rows_late_parts_show_as_the_partial_alone_draws_them(
    fetch_task, oob, idle
):
    task, rows, clock = _rows_of_every_kind(fetch_task)
    if not idle:
        task.status = Task.Status.RUNNING
    partial = get_template("dashboard/task_detail.html#step-row").template
    values = {"task": task, "clock": clock, "oob": oob}
    alone = "".join(partial.render(Context({**values, "row": row})) for row in rows)
    with rowcache.drawing_rows():
        kept = "".join(partial.render(Context({**values, "row": row})) for row in rows)
    for part in rowcache.late_parts(partial):
        kept = part.show(kept, part.holds(Context(values)))
    assert "pippa-part" not in kept
    assert kept == alone
    assert ('hx-swap-oob="true"' in kept) == oob
    assert ("Change course after step" in kept) == idle


def test_a_late_part_needs_a_condition_and_stands_alone():
    engine = get_template("dashboard/task_detail.html").template.engine
    for source in (
        "{% load pippa_rows %}{% late %}x{% endlate %}",
        "{% load pippa_rows %}{% late oob %}x{% endlate %}",
        "{% load pippa_rows %}{% late if oob %}{% late if oob %}x{% endlate %}"
        "{% endlate %}",
    ):
        with pytest.raises(TemplateSyntaxError):
            engine.from_string(source)


def test_a_row_drawn_while_the_task_ran_is_served_once_it_stops_with_its_branch_link(
    dad_client, fetch_task, drawn
):
    task = _run(fetch_task(), 2)  # two of three done; the third never tried
    Task.objects.filter(pk=task.pk).update(status=Task.Status.RUNNING)
    task.refresh_from_db()
    running = _page(dad_client, task)
    assert "Change course after step" not in running
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    drawn.clear()
    paused = _page(dad_client, task)
    assert [i for i in drawn if i > 0] == []  # every row from the cache
    assert "Change course after step 1…" in _row(paused, 1)
    assert "Change course after step 2…" in _row(paused, 2)
    assert "Change course after step" not in _row(paused, 3)
    assert _masked(paused) == _masked(_fresh(dad_client, task))


def test_a_live_updates_row_and_the_pages_row_are_one_kept_row(
    dad_client, fetch_task, drawn
):
    task = _run(fetch_task(), 1)
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner=WORKER,
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    task.refresh_from_db()
    since = task.last_seq
    executor_step(task_id=task.pk, worker_id=WORKER)  # step 2 done meanwhile
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.RUNNING,
        lease_owner=WORKER,
        lease_expires_at=timezone.now() + timedelta(seconds=60),
    )
    task.refresh_from_db()
    two = task.steps.get(position=2).pk
    page = _page(dad_client, task)  # draws step 2's row, and keeps it
    assert 'hx-swap-oob="true" class="step' not in page
    drawn.clear()
    live = dad_client.get(
        task.get_absolute_url(),
        {"since": since, "at": 1, "lease": 1},
        headers={"HX-Request": "true", "HX-Target": "live"},
    ).content.decode()
    assert two not in drawn  # the page's row, from the cache
    assert '<li hx-swap-oob="true" class="step step-done" id="step-2">' in live


# -- two users ----------------------------------------------------------------------


def test_another_user_never_sees_a_cached_row_and_a_hit_skips_no_owner_check(
    dad_client, fetch_task, make_user, make_conversation, drawn
):
    mine = _run(fetch_task(), 3)
    _page(dad_client, mine)  # Dad's rows are in the cache now
    stranger = make_user(username="stranger")
    other = Client()
    other.force_login(stranger)
    # The cache holds Dad's rows: the stranger's request is still refused.
    assert other.get(mine.get_absolute_url()).status_code == 404
    live = {"HX-Request": "true", "HX-Target": "live"}
    poll = f"{mine.get_absolute_url()}?since=0&at=1"
    assert other.get(poll, headers=live).status_code == 404
    assert (
        other.get(
            mine.get_absolute_url(),
            headers={"HX-Request": "true", "HX-Target": "timeline"},
        ).status_code
        == 404
    )
    # The stranger's own task with the same plan: its own rows, none of Dad's.
    theirs = _run(fetch_task(conversation=make_conversation(owner=stranger)), 3)
    drawn.clear()
    body = _page(other, theirs)
    assert sorted(i for i in drawn if i > 0) == sorted(
        theirs.steps.values_list("pk", flat=True)
    )
    for step in mine.steps.all():
        assert f'id="branch-{step.pk}"' not in body
        assert f"/artifacts/{step.output_id}/" not in body
    assert f"/tasks/{mine.pk}/" not in body


# -- the key covers every read ---------------------------------------------------------


class Reads:
    def __init__(self):
        self.paths: set[str] = set()
        self.whole: set[str] = set()  # printed or compared as a whole object
        self.clock: set[str] = set()  # a time read against now
        self.missing: set[str] = set()  # a name the context does not hold
        self.given_whole: frozenset[str] = frozenset()  # the key's whole values


class ReadDatetime(datetime):
    """A datetime that notes when it is subtracted (a time relative to now)."""

    def __sub__(self, other):
        self.reads.clock.add(self.path)
        return datetime.__sub__(datetime.fromisoformat(self.isoformat()), other)

    def __rsub__(self, other):
        self.reads.clock.add(self.path)
        return other - datetime.fromisoformat(self.isoformat())


LEAVES = (str, int, float, bool, timedelta, type(None))


def _wrap(value, path: str, reads: Reads):
    if path in reads.given_whole:
        return value
    if isinstance(value, datetime):
        wrapped = ReadDatetime.fromisoformat(value.isoformat())
        wrapped.path, wrapped.reads = path, reads
        return wrapped
    if isinstance(value, LEAVES):
        return value
    if isinstance(value, list | tuple):
        return [_wrap(item, f"{path}.*", reads) for item in value]
    return Recorder(value, path, reads)


class Recorder:
    """An object of the context that logs every attribute path read below it."""

    def __init__(self, value, path: str, reads: Reads):
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        path = f"{self._path}.{name}"
        self._reads.paths.add(path)
        value = getattr(self._value, name)
        if callable(value) and not isinstance(value, type):
            return lambda: _wrap(value(), path, self._reads)
        return _wrap(value, path, self._reads)

    def __getitem__(self, key):
        raise KeyError(key)

    def __bool__(self) -> bool:
        return bool(self._value)

    def _as_whole(self):
        self._reads.whole.add(self._path)
        return self._value

    def __str__(self) -> str:
        return str(self._as_whole())

    def __eq__(self, other) -> bool:
        return self._as_whole() == other

    def __hash__(self) -> int:
        return hash(self._as_whole())

    def __iter__(self):
        return iter(self._as_whole())

    def __len__(self) -> int:
        return len(self._as_whole())


class RecordingContext(Context):
    def __init__(self, values: dict, reads: Reads):
        super().__init__(values)
        self.reads = reads
        self.roots = set(values)

    def __getitem__(self, key):
        try:
            value = super().__getitem__(key)
        except KeyError:
            self.reads.missing.add(key)
            raise
        if key in self.roots:  # a name given, not a {% with %} name
            self.reads.paths.add(key)
        return value


def _record_partial(name: str, values: dict, whole=frozenset()) -> Reads:
    reads = Reads()
    reads.given_whole = whole
    context = RecordingContext(
        {key: _wrap(value, key, reads) for key, value in values.items()}, reads
    )
    partial = get_template(f"dashboard/task_detail.html#{name}").template
    with rowcache.drawing_rows():  # what a kept row holds: each {% late %} part drawn
        partial.render(context)
    return reads


def _record(row, task: Task, clock, oob: bool) -> Reads:
    return _record_partial(
        "step-row", {"row": row, "task": task, "clock": clock, "oob": oob}
    )


def _unread(reads: Reads, spec: tuple[str, ...]) -> set[str]:
    """The paths read that the key does not hold."""
    allowed = set(spec) | {p.split(".")[0] for p in spec}
    for path in list(allowed):
        while "." in path:  # every step on the way to a path is read
            path = path.rsplit(".", 1)[0]
            allowed.add(path)
    return (reads.paths - allowed) | reads.whole | reads.missing


def _rows_of_every_kind(fetch_task) -> tuple[Task, list]:
    """A task whose page holds a row of each kind the partial draws."""
    task = fetch_task(2)
    task = _run(task, 1)  # done, a text output
    add_steps(task, 1, done=1, media_type="image/png", payload=b"\x89PNG\r\n")
    add_steps(task, 1, done=1, media_type="image/svg+xml", payload=b"<svg/>")
    add_steps(task, 1, done=1, media_type="application/octet-stream")
    missing = add_steps(task, 1, done=1)[-1]
    default_store().path(missing.output.sha256).unlink()
    failed = add_steps(task, 1, status=Step.Status.FAILED)[-1]
    Step.objects.filter(pk=failed.pk).update(attempts=3, error="boom")
    retried = add_steps(task, 1, done=1)[-1]  # done at its second attempt
    for kind, data in [
        ("tool_call_started", {"attempt": 1, "worker": WORKER}),
        ("tool_call_failed", {"attempt": 1, "error": "timeout"}),
        ("step_retried", {"actor": "user:dad"}),
        ("tool_call_started", {"attempt": 2, "generation": 1, "worker": WORKER}),
        ("tool_result_persisted", {"attempt": 2}),
    ]:
        event_append(task_id=task.pk, kind=kind, step_id=retried.pk, data=data)
    interrupted = add_steps(task, 1, done=1)[-1]  # found unfinished, then redone
    for kind, data in [
        ("tool_call_started", {"attempt": 1, "worker": "worker:gone"}),
        ("uncertain_resolved", {"rule": "class2_fetch_again", "worker": WORKER}),
        ("tool_call_started", {"attempt": 2, "worker": WORKER}),
        ("tool_result_persisted", {"attempt": 2}),
    ]:
        event_append(task_id=task.pk, kind=kind, step_id=interrupted.pk, data=data)
    add_steps(task, 1, status=Step.Status.NEEDS_REVIEW)
    skipped = add_steps(task, 1, status=Step.Status.FAILED)[-1]
    actions.step_resolve(step=skipped, action="skip", actor="user:dad")
    later = timezone.now() + timedelta(minutes=3)
    waiting = add_steps(task, 1)[-1]
    Step.objects.filter(pk=waiting.pk).update(attempts=1, next_attempt_at=later)
    running = add_steps(task, 1)[-1]
    Step.objects.filter(pk=running.pk).update(
        status=Step.Status.RUNNING,
        attempts=1,
        started_at=timezone.now(),
        side_effects=True,
    )
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.PAUSED, steps_total=task.steps.count()
    )
    task.refresh_from_db()
    _, rows, clock = task_timeline(task=task)
    return task, rows, clock


def test_the_step_row_partial_reads_only_listed_paths_and_a_kept_row_no_clock(
    fetch_task,
):
    task, rows, clock = _rows_of_every_kind(fetch_task)
    assert any(rowcache.settled(r) for r in rows)
    assert any(not rowcache.settled(r) for r in rows)
    assert any(r.shows_attempts for r in rows)
    seen: set[str] = set()
    for oob in (False, True):
        for row in rows:
            reads = _record(row, task, clock, oob)
            # A late path is read, but drawn in after the rows, never kept.
            spec = rowcache.STEP_ROW.reads + rowcache.STEP_ROW_LATE
            assert _unread(reads, spec) == set(), row.step
            if rowcache.settled(row):
                assert reads.clock == set(), f"a kept row reads the clock: {row.step}"
            seen |= reads.paths
    # The recorder sees the reads (a path left out of the key would fail).
    assert "row.step.output.title" in seen
    assert "row.attempts.*.bar_x" in seen
    spec = tuple(p for p in rowcache.STEP_ROW.reads if p != "row.step.output.title")
    assert "row.step.output.title" in _unread(
        _record(rows[0], task, clock, False), spec
    )


def _made_of(path: str) -> str | None:
    """What a ``row.`` path of the step-row partial is made from, or None."""
    if path in rowcache.STEP_ROW_MADE_OF or path in ("row", "row.step"):
        return "listed"
    step_columns = {"pk"} | {f.name for f in Step._meta.concrete_fields}
    step_columns |= {f.attname for f in Step._meta.concrete_fields}
    output_columns = {"pk"} | {f.name for f in Artifact._meta.concrete_fields}
    if path.startswith("row.step.output"):
        rest = path.removeprefix("row.step.output").lstrip(".")
        return "an output column" if rest in output_columns | {""} else None
    if path.startswith("row.step."):
        rest = path.removeprefix("row.step.")
        return "a step column" if rest in step_columns else None
    head = ".".join(path.split(".")[:2])  # row.attempts.*.bar_x: row.attempts
    return "listed" if head in rowcache.STEP_ROW_MADE_OF else None


def test_every_row_path_the_step_row_partial_reads_is_made_from_the_rows_sources(
    fetch_task, django_assert_num_queries
):
    """The key of a step row is its sources: each ``row.`` read must be a
    column of the step or its output, or listed with what it is made from."""
    row_paths = [p for p in rowcache.STEP_ROW.reads if p.split(".")[0] == "row"]
    assert [p for p in row_paths if _made_of(p) is None] == []
    assert set(rowcache.STEP_ROW_MADE_OF) <= set(rowcache.STEP_ROW.reads)
    # The step's properties the partial reads answer from its columns alone.
    task = _run(fetch_task(), 1)
    bare = Step.objects.get(task=task, position=1)  # nothing related cached
    with django_assert_num_queries(0):
        for path in rowcache.STEP_ROW_MADE_OF:
            if path.startswith("row.step."):
                value = getattr(bare, path.removeprefix("row.step."))
                value() if callable(value) else value
    # A path that is neither fails (the test would see a new read).
    assert _made_of("row.step.task.title") is None
    assert _made_of("row.saved") is None
    # The sources hold every column, whatever the models' fields are.
    _, rows, _ = task_timeline(task=task)
    step_values, last_event, output_values, _ = rows[0].sources()
    assert len(step_values) == len(Step._meta.concrete_fields)
    assert len(output_values) == len(Artifact._meta.concrete_fields)
    assert last_event == task.events.filter(step=rows[0].step).latest("seq").seq


def test_every_path_of_the_key_is_read_by_the_partial(fetch_task):
    """No dead entries: each path of STEP_ROW_READS is read by some row."""
    task, rows, clock = _rows_of_every_kind(fetch_task)
    seen: set[str] = set()
    for row in rows:
        seen |= _record(row, task, clock, True).paths
    listed = {p for p in rowcache.STEP_ROW.reads if not p.endswith(".*")}
    assert listed - seen - {"row.step"} == set()


def test_rows_render_as_the_for_loop_did(dad_client, fetch_task):
    """The tag draws what ``{% for row in rows %}{% partial step-row %}`` drew."""
    task, rows, clock = _rows_of_every_kind(fetch_task)
    template = get_template("dashboard/task_detail.html#step-row")
    expected = "".join(
        template.render({"row": row, "task": task, "clock": clock}) for row in rows
    )
    body = _page(dad_client, task)
    body = _page(dad_client, task)  # the settled rows from the cache
    assert _masked(expected) in _masked(body)


def test_a_safe_string_and_a_str_with_the_same_text_have_different_keys():
    from django.utils.safestring import mark_safe

    assert rowcache.plain("<b>") != rowcache.plain(mark_safe("<b>"))
    assert rowcache.plain(Step.Status.DONE) != rowcache.plain(1)


def test_the_key_covers_every_name_the_event_row_partial_reads(fetch_task):
    task = _run(fetch_task(), 1)
    event_append(
        task_id=task.pk,
        kind="<b>odd</b>",
        data={"note": "<script>alert(1)</script>", "long": "x" * 120},
    )
    events = task_events(task=task).events
    assert len(events) > 3
    seen: set[str] = set()
    for event in events:
        reads = _record_partial(
            "event-row", {"e": event}, whole=rowcache.EVENT_ROW_WHOLE
        )
        assert _unread(reads, rowcache.EVENT_ROW.reads) == set(), event.kind
        assert reads.clock == set()
        seen |= reads.paths
    assert set(rowcache.EVENT_ROW.reads) <= seen
    spec = tuple(p for p in rowcache.EVENT_ROW.reads if p != "e.kind")
    reads = _record_partial("event-row", {"e": events[0]}, rowcache.EVENT_ROW_WHOLE)
    assert "e.kind" in _unread(reads, spec)


def test_an_event_row_in_another_time_zone_is_drawn_again(dad_client, fetch_task):
    from django.utils import dateformat

    task = _run(fetch_task(), 1)
    at = task.events.get(seq=1).created_at
    _page(dad_client, task)  # the rows in UTC are kept
    with timezone.override("Pacific/Chatham"):
        body = _page(dad_client, task)
        local = timezone.localtime(at)
    assert f">{dateformat.format(local, 'j M Y, H:i:s')}</time>" in body
