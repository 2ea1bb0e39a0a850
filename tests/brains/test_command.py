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
