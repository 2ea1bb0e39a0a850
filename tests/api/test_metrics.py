"""GET /metrics: every family with live values after a demo-like run, for
staff or a scraper with the token; 403 for anyone else."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess

import pytest
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from api.services import token_create
from artifacts.store import FolderStore
from notifications.outbox import notify_deliver, notify_settings_save
from pippa_mcp.asgi import MCPApp
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.executing import crash_at, expire_lease, run_task
from tests.support.receivers import HttpSink
from tests.support.workers import tools_env, worker_argv

TOKEN = "scrape-token-for-the-tests-0123456789"

PLAN = [
    {"title": "fetch", "tool": "test.fetch", "args": {}},
    {"title": "file", "tool": "test.file", "args": {}},
    {"title": "snapshot", "tool": "test.snapshot", "args": {}},
    {"title": "render", "tool": "test.render", "args": {"source": 1}},
    {"title": "flaky", "tool": "test.flaky", "args": {"fail_times": 1}},
]


def scrape(client, **headers) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of one scrape with the token."""
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def mcp_get() -> int:
    """One request through the MCP door (a GET, which it answers 405)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/mcp/", "headers": []}
    asyncio.run(MCPApp()(scope, receive, send))
    return sent[0]["status"]


@pytest.fixture
def sink(settings):
    """A webhook receiver on this machine: a json:// address, which the
    operator's settings allow here (that scheme, loopback only)."""
    receiver = HttpSink().start()
    settings.PIPPA_NOTIFY_ALLOW_SCHEMES = ["json"]
    settings.PIPPA_NOTIFY_ALLOW_NETWORKS = ["127.0.0.1/32"]
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    settings.PIPPA_SITE_URL = "http://testserver"
    yield receiver
    receiver.stop()


@pytest.mark.django_db
def test_a_scrape_with_the_token_shows_every_family_with_live_values_after_a_run(
    client,
    make_user,
    make_conversation,
    operator,
    tool_log,
    sink,
    settings,
    tmp_path,
    django_capture_on_commit_callbacks,
):
    settings.PIPPA_METRICS_TOKEN = TOKEN
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    before = scrape(client)

    dad = make_user(username="dad")
    notify_settings_save(user=dad, enabled=True, addresses=sink.url)
    work = task_create(conversation=make_conversation(owner=dad), title="w", steps=PLAN)
    run_task(work.pk)
    # A worker killed mid-call on an outside effect: taken over, set aside.
    mail = task_create(
        conversation=make_conversation(owner=dad),
        title="mail",
        steps=[{"title": "send", "tool": "test.effect", "args": {}}],
    )
    crash_at(mail.pk, "after_started")
    expire_lease(mail.pk)
    # A takeover is counted when its transaction commits.
    with django_capture_on_commit_callbacks(execute=True):
        run_task(mail.pk, worker_id="worker:next")
    assert notify_deliver(worker_id="worker:next").messages == 1
    # A store that cannot be written: a put error.
    (tmp_path / "not-a-folder").write_text("")
    with pytest.raises(FileExistsError):
        FolderStore(tmp_path / "not-a-folder").put_bytes(b"lost")
    # A request through each door.
    client.force_login(dad)
    assert client.get(reverse("dashboard:conversations")).status_code == 200
    api_token = token_create(user=dad, name="runner").raw
    answer = client.get(
        "/api/v1/conversations", headers={"Authorization": f"Bearer {api_token}"}
    )
    assert answer.status_code == 200
    client.force_login(operator)
    assert client.get("/admin/").status_code == 200
    client.logout()
    assert mcp_get() == 405

    after = scrape(client)

    def grew(name, **labels):
        return value(after, name, **labels) > value(before, name, **labels)

    for cls in ("1", "2", "3", "4"):
        assert grew("pippa_steps_started_total", artifact_class=cls), cls
        assert grew("pippa_steps_finished_total", artifact_class=cls, outcome="done")
        assert grew("pippa_step_seconds_count", artifact_class=cls)
    assert grew("pippa_steps_finished_total", artifact_class="2", outcome="retry")
    assert grew(
        "pippa_steps_finished_total", artifact_class="2", outcome="needs_review"
    )
    assert grew("pippa_tool_failures_total", tool="test.flaky")
    assert grew("pippa_lease_takeovers_total")
    assert grew("pippa_uncertain_steps_total", rule="side_effects_review")
    assert grew("pippa_notifications_total", result="sent")
    assert grew("pippa_blob_puts_total", store="folder", result="stored")
    assert grew("pippa_blob_put_bytes_total", store="folder")
    assert grew("pippa_blob_put_seconds_count", store="folder")
    assert grew("pippa_blob_put_errors_total", store="folder")
    for door in ("dashboard", "api", "admin", "mcp"):
        assert grew(
            "pippa_request_seconds_count",
            door=door,
            status="2xx" if door != "mcp" else "4xx",
        ), door
    # Read from the database at the scrape: what is there now.
    assert value(after, "pippa_tasks", status="done") == 1
    assert value(after, "pippa_tasks", status="needs_review") == 1
    assert ("pippa_queue_depth", ()) in after
    assert value(after, "pippa_steps_waiting", status="needs_review") == 1
    assert value(after, "pippa_notices", state="sent") == 1
    assert value(after, "pippa_blob_store_bytes") > 0
    assert value(after, "pippa_blob_store_blobs") >= 5


@pytest.mark.django_db
def test_an_empty_file_a_process_left_in_the_folder_leaves_the_scrape_answering(
    client, make_conversation, settings, tmp_path
):
    """A process creates its counters' file before it sizes it: a scrape at
    that moment, or after the process was killed in it, finds an empty file.
    The other processes' counts and the database's figures are still read."""
    settings.PIPPA_METRICS_TOKEN = TOKEN
    host = tmp_path / "host-metrics"
    host.mkdir()
    run_task(
        task_create(conversation=make_conversation(), title="w", steps=PLAN[:1]).pk
    )
    # Another process's counts: this one's files, copied as they are now.
    own = pathlib.Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    for name in own.glob(f"counter_{os.getpid()}.db"):
        shutil.copy(name, host / "counter_1000001.db")
    (host / "counter_1000002.db").write_bytes(b"")  # killed before it sized it
    (host / "histogram_1000002.db").write_bytes(b"")
    settings.PIPPA_METRICS_DIR = host

    samples = scrape(client)

    assert value(samples, "pippa_tasks", status="done") == 1
    assert (
        value(
            samples,
            "pippa_steps_finished_total",
            artifact_class="1",
            outcome="done",
        )
        >= 1
    )


@pytest.mark.django_db
def test_without_the_token_or_staff_the_metrics_answer_403(
    client, make_user, operator, settings
):
    settings.PIPPA_METRICS_TOKEN = TOKEN

    assert client.get("/metrics").status_code == 403
    wrong = client.get("/metrics", headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 403
    assert b"PIPPA_METRICS_TOKEN" in wrong.content
    client.force_login(make_user(username="dad"))
    assert client.get("/metrics").status_code == 403
    # An API token is a user's, not a scraper's.
    api_token = token_create(user=make_user(username="bob"), name="r").raw
    as_api = client.get("/metrics", headers={"Authorization": f"Bearer {api_token}"})
    assert as_api.status_code == 403
    client.force_login(operator)
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_with_no_token_set_only_staff_may_read_the_metrics(client, operator, settings):
    settings.PIPPA_METRICS_TOKEN = ""

    assert (
        client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 403
    )
    client.force_login(operator)
    assert client.get("/metrics").status_code == 200


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_processes_counts_reach_the_scrape_of_the_web_process(
    client, make_conversation, subprocess_env, tmp_path, settings, tool_log
):
    """Multiprocess mode: a worker in its own process writes its counters to
    the host's metrics folder; the web process's scrape adds them up."""
    settings.PIPPA_METRICS_TOKEN = TOKEN
    host = tmp_path / "host-metrics"  # this host's folder: the worker's files only
    host.mkdir()
    settings.PIPPA_METRICS_DIR = host
    task = task_create(conversation=make_conversation(), title="w", steps=PLAN[:3])
    before = scrape(client)

    done = subprocess.run(
        worker_argv(task.pk),
        cwd=REPO,
        env=tools_env(
            subprocess_env,
            tmp_path / "calls.jsonl",
            PROMETHEUS_MULTIPROC_DIR=str(host),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    after = scrape(client)
    for cls in ("1", "2", "3"):
        key = (
            "pippa_steps_finished_total",
            (("artifact_class", cls), ("outcome", "done")),
        )
        assert after.get(key, 0) - before.get(key, 0) == 1, cls
    assert value(after, "pippa_tasks", status="done") == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_only_host_serves_its_counters_to_a_scraper_with_the_token(
    make_conversation, subprocess_env, tmp_path, tool_log
):
    """A host with workers and no web process: ``pippa_worker --metrics-port``
    serves the host's folder of counters, 403 without the token."""
    import time
    import urllib.error
    import urllib.request

    from tests.support.seaweed import free_ports

    task = task_create(conversation=make_conversation(), title="w", steps=PLAN[:2])
    [port] = free_ports(1)
    folder = tmp_path / "host-metrics"
    folder.mkdir()
    env = tools_env(
        subprocess_env,
        tmp_path / "calls.jsonl",
        PIPPA_METRICS_TOKEN=TOKEN,
        PROMETHEUS_MULTIPROC_DIR=str(folder),
    )
    child = subprocess.Popen(
        [
            *worker_argv(task.pk, until_idle=False, poll=0.2),
            "--metrics-port",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def fetch(token: str | None) -> tuple[int, str]:
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, ""

    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            try:
                status, text = fetch(TOKEN)
            except OSError:
                time.sleep(0.2)
                continue
            if 'outcome="done"' in text and text.count('outcome="done"') >= 2:
                break
            time.sleep(0.2)
        assert (
            'pippa_steps_finished_total{artifact_class="1",outcome="done"} 1.0' in text
        )
        assert (
            'pippa_steps_finished_total{artifact_class="2",outcome="done"} 1.0' in text
        )
        assert fetch(None)[0] == 403
        assert fetch("wrong")[0] == 403
    finally:
        child.terminate()
        child.wait(timeout=30)
