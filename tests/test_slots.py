"""The bounds on calls in flight hold for a whole host: every web process of it
counts against the same slots (``pippa_site.slots``), and a slot comes back
however its call ends, even with its process killed."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from pippa_site.errors import Busy, TooMany
from pippa_site.slots import Slots
from tests.conftest import REPO


def _slots() -> Slots:
    """What one web process holds: a second call makes a second process's."""
    return Slots(
        "step runs",
        per_user="PIPPA_STEP_RUNS_PER_USER",
        overall="PIPPA_STEP_RUNS",
        retry_after=5,
    )


def test_two_processes_share_each_users_bound(settings):
    settings.PIPPA_STEP_RUNS_PER_USER = 2
    first, second = _slots(), _slots()

    held = [first.take(7), second.take(7)]
    with pytest.raises(TooMany) as refused:
        first.take(7)
    with pytest.raises(TooMany):
        second.take(7)
    others = second.take(8)  # another user is not held up

    assert "you already have 2 step runs in flight" in str(refused.value)
    assert refused.value.retry_after == 5
    first.give_back(held[0])
    again = second.take(7)  # the slot given back is free on the host
    for ticket in (held[1], others, again):
        second.give_back(ticket)
    assert first.held == {}
    assert second.held == {}


def test_past_the_hosts_bound_a_call_is_busy_and_holds_nothing(settings):
    settings.PIPPA_STEP_RUNS = 2
    settings.PIPPA_STEP_RUNS_PER_USER = 2
    first, second = _slots(), _slots()
    held = [first.take(1), second.take(2)]

    with pytest.raises(Busy) as refused:
        first.take(3)
    # The refused call gave its user's slot back: two more of user 3's fit
    # once the host has room.
    second.give_back(held[1])
    mine = [first.take(3)]
    first.give_back(held[0])
    mine.append(second.take(3))

    assert "the server is running 2 step runs at once" in str(refused.value)
    for ticket in mine:
        first.give_back(ticket)
    assert first.held == {}


def test_a_ticket_given_back_twice_frees_one_slot_once(settings):
    settings.PIPPA_STEP_RUNS_PER_USER = 1
    slots = _slots()
    ticket = slots.take(5)

    slots.give_back(ticket)
    slots.give_back(ticket)  # a finally after an earlier give-back
    held = slots.take(5)

    with pytest.raises(TooMany):
        slots.take(5)
    slots.give_back(held)


def test_the_bound_holds_while_a_call_runs_and_not_after_it(settings):
    settings.PIPPA_STEP_RUNS_PER_USER = 1
    slots = _slots()

    with slots.hold(4):
        assert slots.held == {4: 1}
        with pytest.raises(TooMany):
            slots.take(4)
    with pytest.raises(RuntimeError), slots.hold(4):
        raise RuntimeError("the tool failed")
    with slots.hold(4):
        pass

    assert slots.held == {}


@pytest.mark.slow
def test_another_web_process_holding_a_slot_counts_and_its_death_gives_it_back(
    settings, subprocess_env, tmp_path
):
    """A real second process: while it runs a user's step, this one may not
    start another for that user; killed mid-call, its slot is free at once."""
    settings.PIPPA_STEP_RUNS_PER_USER = 1
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, django; django.setup();"
            "from pippa_site.slots import STEP_RUNS;"
            "STEP_RUNS.take(9); print('held', flush=True); time.sleep(120)",
        ],
        cwd=REPO,
        env={
            **subprocess_env,
            "PIPPA_SLOTS_DIR": str(settings.PIPPA_SLOTS_DIR),
            "PIPPA_STEP_RUNS_PER_USER": "1",
        },
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(TooMany):
            _slots().take(9)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        slots = _slots()
        slots.give_back(slots.take(9))
    finally:
        child.kill()
        child.wait(timeout=30)
