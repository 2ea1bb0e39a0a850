"""The demo command: dad's conversations showing the executor, loaded once."""

from __future__ import annotations

import sys
import types

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tasks.demo import LIVE_PAUSE
from tasks.models import Conversation, Event, Step, Task
from tasks.resume import resume_advice


@pytest.mark.django_db
def test_pippa_demo_loads_every_case_once_for_a_non_staff_dad(monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("council.demo")
    fake.demo_round_load = lambda *, owner: calls.append(owner.username)
    monkeypatch.setitem(sys.modules, "council.demo", fake)
    monkeypatch.setenv("PIPPA_DEMO_PASSWORD", "a-chosen-password")

    call_command("pippa_demo")
    dad = get_user_model().objects.get(username="dad")
    assert not dad.is_staff
    assert dad.check_password("a-chosen-password")
    assert "dad / a-chosen-password" in capsys.readouterr().out
    assert calls == ["dad"]
    counts = (Conversation.objects.count(), Task.objects.count(), Event.objects.count())
    assert counts[0] == 5

    finished = Task.objects.get(title="Chart PIPA's first half")
    assert (finished.status, finished.steps_done) == ("done", 4)
    classes = set(
        Step.objects.filter(task=finished).values_list(
            "output__artifact_class", flat=True
        )
    )
    assert classes == {1, 2, 3, 4}

    interrupted = Conversation.objects.get(title="PIPA: interrupted at each boundary")
    words = {}
    for task in interrupted.tasks.all():
        assert task.status == "paused"
        assert task.lease_owner == ""
        nxt = Step.objects.filter(task=task).not_done().order_by("position").first()
        words[task.title] = resume_advice(nxt).words
    # Written but never recorded, so never shown: the search may go out again.
    assert words[
        "Stopped after the search snapshot was written, before it was recorded"
    ].startswith("will issue the call again")
    assert words["Stopped after a note to Dad was sent"] == (
        "needs you: the tool has outside effects"
    )
    assert words["Stopped after the search started, before it ran"].startswith(
        "will issue the call again"
    )

    retried = Task.objects.get(title="Chart PIPA despite an outage")
    assert retried.status == "done"
    assert Event.objects.filter(task=retried, kind="step_retried").count() == 1
    branch = Task.objects.get(branched_from__isnull=False)
    assert (branch.branched_at, branch.status) == (2, "done")
    live = Task.objects.get(title__startswith="Chart PIPA slowly")
    assert live.status == "queued"
    assert Step.objects.filter(task=live, args__pause=LIVE_PAUSE).count() == 8

    call_command("pippa_demo")
    assert (
        Conversation.objects.count(),
        Task.objects.count(),
        Event.objects.count(),
    ) == counts
    assert "nothing to do" in capsys.readouterr().out
