"""One task per adapter, driven against its loopback vendor, killed mid-step and
finished by a different adapter over the JSON API: same plan, same artifacts."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from api.services import token_create
from brains.runner import LocalBackend, run_brain
from brains.scripted import ScriptedBrain
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tasks.tools import tools_load
from tests.conftest import REPO
from tests.support.fake_vendors import API_KEY, FAKES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PLAN = [
    {"title": "Fetch closes", "tool": "demo.closes", "args": {"end": "2024-01-31"}},
    {"title": "Fetch at the gate", "tool": "test.gate", "args": {"label": "g"}},
    {"title": "Chart the closes", "tool": "demo.chart", "args": {"source": 1}},
]
# (vendor, brain) that starts and is killed -> (vendor, brain) that resumes.
PAIRS = [
    (("openai", "codex"), ("anthropic", "claude")),
    (("anthropic", "claude"), ("gemini", "gemini")),
    (("gemini", "gemini"), ("openai", "grok")),
]
LEASE_SECONDS = 2


def plan_of(task: Task) -> list[tuple]:
    return [
        (s.position, s.title, s.tool, s.args, s.status)
        for s in task.steps.order_by("position")
    ]


def outputs_of(task: Task) -> list[str]:
    return [
        s.output.sha256
        for s in task.steps.select_related("output").order_by("position")
    ]


def brain_command(python_exe, task_id, vendor, brain, fake, *extra):
    return [
        python_exe,
        "manage.py",
        "pippa_brain",
        str(task_id),
        "--brain",
        brain,
        "--kind",
        vendor,
        "--model",
        f"{brain}-test-model",
        "--base-url",
        fake.base_url,
        "--api-key-env",
        "FAKE_VENDOR_KEY",
        "--timeout",
        "20",
        "--lease-wait",
        "60",
        *extra,
    ]


@pytest.fixture
def gate_tools(settings):
    settings.PIPPA_TOOLS = [*settings.PIPPA_TOOLS, "tests.support.brain_tools"]
    settings.PIPPA_LEASE_SECONDS = LEASE_SECONDS
    tools_load()


@pytest.mark.parametrize(
    ("first", "second"), PAIRS, ids=[f"{a[1]}-then-{b[1]}" for a, b in PAIRS]
)
def test_a_task_killed_mid_step_is_finished_by_another_adapter_with_the_same_result(
    first,
    second,
    gate_tools,
    make_conversation,
    user,
    live_server,
    subprocess_env,
    python_exe,
    tmp_path,
):
    task = task_create(
        conversation=make_conversation(owner=user), title="Chart PIPA", steps=PLAN
    )
    hold, entered = tmp_path / "gate-hold", tmp_path / "gate-entered"
    hold.write_text("hold")
    env = {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.brain_tools",
        "PIPPA_LEASE_SECONDS": str(LEASE_SECONDS),
        "PIPPA_GATE_HOLD": str(hold),
        "PIPPA_GATE_ENTERED": str(entered),
        "FAKE_VENDOR_KEY": API_KEY,
        "PIPPA_API_TOKEN": token_create(user=user, name="e2e").raw,
    }
    (vendor_a, brain_a), (vendor_b, brain_b) = first, second
    with FAKES[vendor_a]() as fake_a, FAKES[vendor_b](read_outputs=True) as fake_b:
        # 1. The first adapter runs in-process against the DB and is killed
        #    while step 2's tool call is in flight.
        runner_a = subprocess.Popen(
            brain_command(python_exe, task.pk, vendor_a, brain_a, fake_a),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while not entered.exists():
            assert runner_a.poll() is None, runner_a.stdout.read().decode()
            assert time.monotonic() < deadline, "runner A never reached the gate"
            time.sleep(0.05)
        runner_a.send_signal(signal.SIGKILL)
        runner_a.wait(timeout=30)
        runner_a.stdout.close()
        hold.unlink()

        task.refresh_from_db()
        step2 = task.steps.get(position=2)
        assert task.brain == brain_a
        assert task.steps.get(position=1).status == "done"
        assert step2.status == "running"  # the uncertain state: envelope open

        # 2. A different adapter resumes over the JSON API.
        finished = subprocess.run(
            brain_command(
                python_exe,
                task.pk,
                vendor_b,
                brain_b,
                fake_b,
                "--api-url",
                live_server.url,
            ),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert finished.returncode == 0, finished.stdout + finished.stderr
        assert fake_a.errors == []
        assert fake_b.errors == []
        opening_b = json.dumps(fake_b.requests[0].body)
        assert task.steps.get(position=1).output.sha256 in opening_b
        assert fake_b.tool_results(fake_b.requests[-1].body)[-1][0] in (
            "run_next_step",
            "read_artifact",
        )

    task.refresh_from_db()
    assert task.status == Task.Status.DONE
    assert task.brain == brain_b
    assert task.lease_owner == ""
    brains = list(
        Event.objects.filter(task=task, kind="brain_changed")
        .order_by("seq")
        .values_list("data__brain", flat=True)
    )
    assert brains == [brain_a, brain_b]
    assert Event.objects.filter(task=task, kind=Event.Kind.LEASE_TAKEN_OVER).exists()
    assert (
        Event.objects.filter(step=step2, kind=Event.Kind.TOOL_CALL_STARTED).count() == 2
    )

    # 3. The same plan, run once without interruption, ends the same way.
    reference = task_create(
        conversation=make_conversation(owner=user), title="Chart PIPA", steps=PLAN
    )
    run_brain(
        brain=ScriptedBrain(), backend=LocalBackend(user=user), task_id=reference.pk
    )
    reference.refresh_from_db()
    assert [p[1:] for p in plan_of(task)] == [p[1:] for p in plan_of(reference)]
    assert all(status == "done" for *_, status in plan_of(task))
    assert outputs_of(task) == outputs_of(reference)
    assert Step.objects.filter(task=task, output__isnull=True).count() == 0
