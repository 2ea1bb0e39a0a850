"""A real model drives a task: llama.cpp's server and SmolLM2-135M from the ``local`` extra.

Slow (a turn takes 3-30 s on 2 cores) and so in the full suite only. The
model is far too small to do the task well; what is tested is that Pippa's
side holds whatever it sends: no HTTP error, no crash, a run that ends or
stops cleanly within its turn budget, and a runner killed mid-run that a
second one resumes from the durable state (same plan, nothing run twice).
Skipped, with the reason, only where the extra is not installed
(``make install-local``).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time

import pytest

from brains.local import DEMO_CONVERSATION, DEMO_STEPS, MODEL_NAME, missing_packages
from tasks.actions import step_run
from tasks.lease import lease_release_own
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.fake_vendors import RecordingProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MISSING = missing_packages()
needs_local = pytest.mark.skipif(
    bool(MISSING),
    reason=f"the 'local' extra is not installed ({', '.join(MISSING)}): "
    "run `make install-local` to build llama.cpp's server",
)
LEASE_SECONDS = 2
# The context of ``make local-brain``: every turn's request is fitted into
# three quarters of it (``brains.runner.Room.for_context``), so a runaway
# answer (the server's tool calls ignore max_tokens) that fills the context
# is shortened in the next turn's request instead of outgrowing it.
CONTEXT_TOKENS = 4096
TURNS = 3


@pytest.fixture(scope="module")
def llama_server():
    from brains.local import LocalModelServer

    # An answer that never closes its tool call's arguments ends when the
    # context is full (the server's tool-calling format ignores max_tokens).
    with LocalModelServer(context_tokens=CONTEXT_TOKENS) as server:
        yield server


def brain_env(subprocess_env) -> dict[str, str]:
    return {**subprocess_env, "PIPPA_LEASE_SECONDS": str(LEASE_SECONDS)}


def run_counts(task: Task, kind: str = "tool_result_persisted") -> dict[int, int]:
    """Each step's position -> how many of its calls finished (or, by ``kind``, started)."""
    counts = {s.position: 0 for s in task.steps.all()}
    for event in Event.objects.filter(task=task, kind=kind).select_related("step"):
        counts[event.step.position] += 1
    return counts


def plan_of(task: Task) -> list[tuple]:
    return [(s.title, s.tool, s.args) for s in task.steps.order_by("position")]


@needs_local
@pytest.mark.timeout(1800)
def test_pippa_brain_local_drives_the_demo_task_to_a_clean_stop(
    user, subprocess_env, python_exe
):
    done = subprocess.run(
        [
            python_exe,
            "manage.py",
            "pippa_brain",
            "--local",
            "--demo-task",
            "--demo-steps",
            "20",
            "--local-context",
            str(CONTEXT_TOKENS),
            # make local-brain gives it 24; three show each turn fits.
            "--max-turns",
            str(TURNS),
        ],
        cwd=REPO,
        env=brain_env(subprocess_env),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # The server the command started is gone with it.
    port = int(re.search(r"on 127\.0\.0\.1:(\d+)", out).group(1))
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", port), 2),
    ):
        pass
    assert "Traceback" not in out
    assert "HTTP" not in out
    task = Task.objects.get(conversation__title=DEMO_CONVERSATION)
    turns = Event.objects.filter(task=task, kind="brain_turn")
    assert task.brain == "ollama"
    assert task.steps_total == 20
    assert 1 <= turns.count() <= TURNS
    assert all(t.data["model"] == MODEL_NAME for t in turns)
    assert all(t.data["total_tokens"] > 0 for t in turns)
    # No request outgrew the context: every turn's prompt and answer fit in it.
    assert all(t.data["total_tokens"] <= CONTEXT_TOKENS for t in turns)
    assert all(t.data["input_tokens"] <= CONTEXT_TOKENS * 3 / 4 for t in turns)
    assert task.status in ("queued", "running", "done")
    assert task.lease_owner == ""
    assert all(n <= 1 for n in run_counts(task).values())
    print(out)  # the transcript's shape, for the record (pytest -s)


def _answered(exchanges: list) -> list:
    """The proxy's exchanges but the requests the server refused for their
    length (HTTP 400 naming the context), which the runner sends again smaller."""
    return [
        (request, status, answer)
        for request, status, answer in exchanges
        if not (status == 400 and "context" in str(answer).lower())
    ]


@needs_local
@pytest.mark.timeout(1800)
def test_a_runner_killed_mid_run_is_resumed_from_the_state_alone_by_a_fresh_server(
    llama_server, make_conversation, user, subprocess_env, python_exe
):
    task = task_create(
        conversation=make_conversation(owner=user), title="Demo", steps=DEMO_STEPS
    )
    # Step 1 done before the brains come: state a resumed brain must read.
    step_run(task=task, worker_id="setup")
    lease_release_own(task=task, worker_id="setup")
    first = Step.objects.select_related("output").get(task=task, position=1)
    assert first.status == "done"

    def runner(proxy, max_turns):
        return [
            python_exe,
            "manage.py",
            "pippa_brain",
            str(task.pk),
            "--brain",
            "ollama",
            "--base-url",
            proxy.base_url,
            "--model",
            MODEL_NAME,
            "--timeout",
            "900",
            "--max-turns",
            str(max_turns),
            "--context-tokens",
            str(CONTEXT_TOKENS),
            "--lease-wait",
            "30",
        ]

    env = brain_env(subprocess_env)
    with RecordingProxy(llama_server.base_url) as proxy:
        killed = subprocess.Popen(
            runner(proxy, 20),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 900
        # Killed once the brain has answered and its next request is out.
        while (
            len(proxy.exchanges) < 1
            or not Event.objects.filter(task=task, kind="brain_turn").exists()
        ):
            assert killed.poll() is None, killed.stdout.read().decode()
            assert time.monotonic() < deadline, "the brain never answered"
            time.sleep(0.2)
        time.sleep(1.0)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        killed.stdout.close()
        # The killed runner's request would run on to its end ahead of the next
        # one (llama.cpp answers one at a time, and its tool-calling format
        # ignores max_tokens: one such answer ran 13 minutes here). The server
        # holds nothing between requests, so a fresh one at the same address
        # serves the resumed runner; what it knows comes from Pippa's state.
        llama_server.stop()
        llama_server.start()
        time.sleep(1.0)  # the proxy's side of the cut request has ended
        task.refresh_from_db()
        plan_at_kill = plan_of(task)
        rewrites_at_kill = Event.objects.filter(
            task=task, kind="plan_rewritten"
        ).count()
        before = len(proxy.exchanges)

        resumed = subprocess.run(
            runner(proxy, 1),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, out

    # The killed runner's first answer, and every answer to the resumed one, are
    # 200 (the request the kill cut off may have ended any way). A request the
    # server refused for its length (400 naming the context) does not count: the
    # runner sends it again, smaller (brains.runner.Runner._context_full), and the
    # first request's size is an estimate until the model has counted one.
    killed_run = _answered(proxy.exchanges[:before])
    resumed_run = _answered(proxy.exchanges[before:])
    assert killed_run[0][1] == 200, killed_run[0]
    assert all(status == 200 for _, status, _ in resumed_run), resumed_run
    # The resumed brain's first request carries the state: step 1 done, its
    # output; nothing of the killed runner's chat.
    request = proxy.exchanges[before][0]
    opening = request["messages"][1]["content"]
    assert "Resume context (pippa.resume/3" in opening
    assert first.output.sha256 in opening
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    task.refresh_from_db()
    if (
        Event.objects.filter(task=task, kind="plan_rewritten").count()
        == rewrites_at_kill
    ):
        assert plan_of(task) == plan_at_kill
    assert plan_of(task)[0] == plan_at_kill[0]
    counts = run_counts(task)
    # Step 1 ran once, before the brains: never called again.
    assert run_counts(task, "tool_call_started")[1] == 1
    assert all(n <= 1 for n in counts.values()), counts  # no step finished twice
    assert Step.objects.get(pk=first.pk).output_id == first.output_id
    assert task.lease_owner == ""
    turns = Event.objects.filter(task=task, kind="brain_turn").count()
    assert turns >= 2
    assert json.dumps(proxy.exchanges[-1][2]).count('"usage"') == 1
