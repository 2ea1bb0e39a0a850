"""The demo command: dad's conversations showing the executor, loaded once."""

from __future__ import annotations

import sys
import types

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tasks.demo import LIVE_CONVERSATION, LIVE_PAUSE, LIVE_TASK_TITLE
from tasks.management.commands.pippa_demo import DEMO_INTERRUPTED
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

    finished = Task.objects.get(title="Chart Pippa Paper's first half of 2024")
    assert (finished.status, finished.steps_done) == ("done", 4)
    classes = set(
        Step.objects.filter(task=finished).values_list(
            "output__artifact_class", flat=True
        )
    )
    assert classes == {1, 2, 3, 4}

    interrupted = Conversation.objects.get(title=DEMO_INTERRUPTED)
    words = {}
    for task in interrupted.tasks.all():
        assert task.status == "paused"
        assert task.lease_owner == ""
        nxt = Step.objects.filter(task=task).not_done().order_by("position").first()
        words[task.title] = resume_advice(nxt).words
    # Written but never recorded, so never shown: the search may go out again.
    assert words["The computer stopped while filing the news it found"].startswith(
        "will issue the call again"
    )
    assert words["The computer stopped just after sending Dad a note"] == (
        "needs you: the tool has outside effects"
    )
    assert words["The computer stopped as the news search began"].startswith(
        "will issue the call again"
    )

    retried = Task.objects.get(title__startswith="Chart Pippa Paper's shares while")
    assert retried.status == "done"
    assert Event.objects.filter(task=retried, kind="step_retried").count() == 1
    branch = Task.objects.get(branched_from__isnull=False)
    assert (branch.branched_at, branch.status) == (2, "done")
    live = Task.objects.get(title=LIVE_TASK_TITLE)
    assert live.status == "queued"
    assert Step.objects.filter(task=live, args__pause=LIVE_PAUSE).count() == 8

    call_command("pippa_demo")
    assert (
        Conversation.objects.count(),
        Task.objects.count(),
        Event.objects.count(),
    ) == counts
    assert "nothing to do" in capsys.readouterr().out


@pytest.mark.django_db
def test_dads_login_starts_a_fresh_live_task_once_the_last_has_finished(
    client, make_user, make_conversation
):
    dad = make_user(username="dad")
    live = make_conversation(owner=dad, title=LIVE_CONVERSATION)
    mum = make_user(username="mum")
    make_conversation(owner=mum, title=LIVE_CONVERSATION)

    client.force_login(dad)  # nothing ran yet: one starts
    client.force_login(dad)  # one is queued: no second
    client.force_login(mum)  # not the demo's user: nothing

    [task] = Task.objects.all()
    assert (task.conversation, task.title, task.status) == (
        live,
        LIVE_TASK_TITLE,
        "queued",
    )
    Task.objects.filter(pk=task.pk).update(status=Task.Status.DONE)
    client.force_login(dad)
    assert Task.objects.filter(conversation=live, status="queued").count() == 1
    assert Task.objects.count() == 2
