"""The task page keeps a settled step row's drawn parts in Django's cache
("fragments", ``{% cache %}``) under a key made of everything they show
(``StepRow.fragment_key``): the page is the same with or without it, a
row whose step changed in any way is drawn anew, and a kept row reads
nothing from the blob store.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.core.cache import caches
from django.core.cache.utils import make_template_fragment_key
from django.template.loader import render_to_string
from django.test import Client
from django.utils import timezone

from artifacts.store import default_store
from dashboard.selectors.timeline import task_timeline
from tasks.doctor import doctor_run
from tasks.executor import step
from tasks.models import Step, Task
from tests.support.blobs import blob_lose

pytestmark = pytest.mark.django_db

WORKER = "worker:test-fragments"


@pytest.fixture(autouse=True)
def empty_fragments():
    caches["fragments"].clear()
    yield
    caches["fragments"].clear()


def _rows_html(body: str) -> dict[str, str]:
    """Each step row's ``<li>``, by its id."""
    return {
        m[1]: m[0]
        for m in re.finditer(
            r'<li class="step [^"]*" id="(step-\d+)">.*?\n    </li>', body, re.S
        )
    }


def _axis_free(rows: dict[str, str]) -> dict[str, str]:
    return {k: re.sub(r'viewBox="0 0 \d+ 14"', "", v) for k, v in rows.items()}


def _page(client, task: Task) -> str:
    response = client.get(task.get_absolute_url())
    assert response.status_code == 200
    return response.content.decode()


def _ran(task: Task, steps: int) -> Task:
    for _ in range(steps):
        step(task_id=task.pk, worker_id=WORKER)
    task.refresh_from_db()
    return task


def test_a_page_drawn_from_kept_rows_is_the_page_drawn_afresh(dad_client, fetch_task):
    task = _ran(fetch_task(4), 2)
    fresh = _rows_html(_page(dad_client, task))
    kept = _rows_html(_page(dad_client, task))  # rows 1 and 2 come from the cache
    assert set(fresh) == {"step-1", "step-2", "step-3", "step-4"}
    # The same rows; only the axis has grown meanwhile (the task runs on).
    assert _axis_free(kept) == _axis_free(fresh)
    _, rows, clock = task_timeline(task=task)
    for row in rows[:2]:
        # The whole row, in two parts around its bars' axis (the one thing
        # that follows the clock).
        for part, vary_on in [
            ("step-row-head", [row.fragment_key]),
            ("step-row-close", [row.fragment_key, clock.started_at]),
        ]:
            key = make_template_fragment_key(part, vary_on)
            assert caches["fragments"].get(key) is not None


def test_a_page_drawn_from_kept_rows_reads_nothing_from_the_store(
    dad_client, fetch_task, monkeypatch
):
    """A kept row's excerpt comes with it: only a page with a row to draw
    reads its outputs' first bytes, all of them in one pass."""
    task = _ran(fetch_task(3), 2)
    fresh = _rows_html(_page(dad_client, task))
    reads = []
    store = type(default_store())
    heads = store.heads

    def counted(self, shas, size):
        reads.append(list(shas))
        return heads(self, shas, size)

    monkeypatch.setattr(store, "heads", counted)
    kept = _rows_html(_page(dad_client, task))
    assert reads == []
    assert _axis_free(kept) == _axis_free(fresh)
    assert 'class="excerpt"' in kept["step-1"]

    task = _ran(task, 1)  # step 3's row is new: the page reads once
    rows = _rows_html(_page(dad_client, task))
    assert len(reads) == 1
    assert len(reads[0]) == 3
    assert 'class="excerpt"' in rows["step-3"]


def test_a_kept_row_says_its_output_is_missing_once_the_doctor_finds_it_gone(
    dad_client, fetch_task
):
    task = _ran(fetch_task(2), 1)
    assert 'class="excerpt"' in _rows_html(_page(dad_client, task))["step-1"]
    blob_lose(Step.objects.get(task=task, position=1).output.sha256)
    doctor_run(repair=True, grace_seconds=0)
    row = _rows_html(_page(dad_client, task))["step-1"]
    assert "The saved file for this output is missing." in row
    assert 'class="excerpt"' not in row


def test_a_step_changed_behind_the_page_is_drawn_anew_not_from_the_cache(
    dad_client, fetch_task
):
    task = _ran(fetch_task(3), 1)
    assert "Fetch 1" in _rows_html(_page(dad_client, task))["step-1"]
    # A repair in the admin: no event, only the row changes.
    Step.objects.filter(task=task, position=1).update(title="Closing prices, checked")
    row = _rows_html(_page(dad_client, task))["step-1"]
    assert "Closing prices, checked" in row
    assert "Fetch 1" not in row


def test_a_done_row_gains_its_branch_link_when_the_task_goes_idle(
    dad_client, fetch_task
):
    task = _ran(fetch_task(3), 1)
    assert (
        "Change course after step 1"
        not in _rows_html(_page(dad_client, task))["step-1"]
    )
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    task.refresh_from_db()
    assert "Change course after step 1" in _rows_html(_page(dad_client, task))["step-1"]


def test_a_kept_row_offers_its_branch_link_only_to_the_tasks_owner(
    dad_client, user, fetch_task, make_user
):
    """Staff read another's task but act only on their own: a row kept from
    the owner's page must not offer them "Change course", and a row kept from
    theirs must not take it from the owner, in either order."""
    task = _ran(fetch_task(3), 1)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.PAUSED)
    task.refresh_from_db()
    staff = Client()
    staff.force_login(make_user(username="boss", is_staff=True, is_superuser=True))
    link = "Change course after step 1"
    for first, second in [(dad_client, staff), (staff, dad_client)]:
        caches["fragments"].clear()
        for who in (first, second):
            row = _rows_html(_page(who, task))["step-1"]
            assert (link in row) == (who is dad_client)


def test_rows_whose_words_follow_the_clock_are_never_kept(fetch_task):
    task = _ran(fetch_task(3), 1)
    Step.objects.filter(task=task, position=2).update(
        status=Step.Status.RUNNING, attempts=1
    )
    Step.objects.filter(task=task, position=3).update(
        attempts=1, next_attempt_at=timezone.now() + timedelta(minutes=1)
    )
    task.refresh_from_db()
    _, rows, _ = task_timeline(task=task)
    keys = {row.step.position: row.fragment_key for row in rows}
    assert keys[1]  # done: kept
    assert keys[2] == ""  # running: "started 5 s ago"
    assert keys[3] == ""  # waiting to retry: "next attempt in 1 min"


def test_two_rows_that_differ_in_anything_they_show_have_different_keys(fetch_task):
    task = _ran(fetch_task(3), 2)
    _, rows, _ = task_timeline(task=task)
    first, second = rows[0].fragment_key, rows[1].fragment_key
    assert first
    assert second
    assert first != second
    Step.objects.filter(task=task, position=1).update(max_attempts=9)
    _, again, _ = task_timeline(task=task)
    assert again[0].fragment_key != first
    assert again[1].fragment_key == second


def test_a_kept_row_swaps_out_of_band_in_a_live_update_and_never_on_the_page(
    dad_client, fetch_task
):
    """The same settled row is kept once for the page and once for the live
    update, which must carry htmx's out-of-band mark (and the page must not)."""
    task = _ran(fetch_task(4), 1)
    page = _page(dad_client, task)
    poll = html.unescape(re.search(r'id="live"[^>]*?hx-get="([^"]+)"', page)[1])
    task = _ran(task, 1)  # step 2 is done after the page was drawn

    def live() -> str:
        answer = dad_client.get(
            poll, headers={"HX-Request": "true", "HX-Target": "live"}
        )
        assert answer.status_code == 200
        return answer.content.decode()

    for _ in range(2):  # drawn, then from the cache
        assert '<li hx-swap-oob="true" class="step step-done" id="step-2">' in live()
        assert '<li class="step step-done" id="step-2">' in _page(dad_client, task)


@pytest.mark.parametrize("side_effects", [False, True])
def test_a_step_not_begun_is_drawn_short_exactly_as_the_full_row_draws_it(
    fetch_task, side_effects
):
    """Most of a long plan is steps not begun, drawn by the short
    ``step-row-planned`` (no cache, none of the full row's questions): what
    it draws is what the full row's head and body draw for such a step."""
    task = _ran(fetch_task(3), 1)
    Step.objects.filter(task=task, position=3).update(
        side_effects=side_effects, artifact_class=4
    )
    task.refresh_from_db()
    _, rows, _ = task_timeline(task=task)
    done, planned = rows[0], rows[2]
    assert not done.planned
    assert planned.planned

    def drawn(*parts: str) -> str:
        text = "".join(
            render_to_string(f"dashboard/task_detail.html#{part}", {"row": planned})
            for part in parts
        )
        return " ".join(text.split())

    short = drawn("step-row-planned")
    assert short == drawn("step-row-head", "step-row-body")
    assert ("acts outside Pippa" in short) == side_effects
    # A step that ran before (its events hold an attempt) is drawn whole,
    # even pending again.
    Step.objects.filter(task=task, position=1).update(
        status=Step.Status.PENDING, attempts=0, output=None
    )
    _, again, _ = task_timeline(task=task)
    assert not again[0].planned
