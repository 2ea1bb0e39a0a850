"""Serving: compressed HTML that stays safe against BREACH, payloads left as they
are, and the production server (gunicorn's uvicorn workers serving the ASGI
application) bounding what a client may send, with a deadline for every phase a
client controls, a cap on connections, and slow clients costing nothing."""

from __future__ import annotations

import gc
import gzip
import http.client
import json
import os
import re
import resource
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.urls import reverse

from pippa_site import gunicorn_conf
from tasks.models import Task
from tests.conftest import REPO
from tests.support.promptness import assert_answered_promptly

TOKEN = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.mark.django_db
def test_html_pages_are_gzip_compressed_for_a_client_that_accepts_it(client, user):
    client.force_login(user)
    response = client.get("/", headers={"Accept-Encoding": "gzip, deflate, br"})
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response["Vary"]
    page = gzip.decompress(response.content)
    assert b"</html>" in page
    assert len(response.content) < len(page)


@pytest.mark.django_db
def test_a_client_that_does_not_accept_gzip_gets_plain_html(client, user):
    client.force_login(user)
    response = client.get("/")
    assert "Content-Encoding" not in response
    assert b"</html>" in response.content


@pytest.mark.django_db
def test_two_compressed_login_pages_differ_in_length_and_csrf_token(client):
    """BREACH needs a stable secret and a stable length; neither is."""
    pages = [
        client.get("/login/", headers={"Accept-Encoding": "gzip"}) for _ in range(6)
    ]
    assert all(p["Content-Encoding"] == "gzip" for p in pages)
    tokens = {TOKEN.search(gzip.decompress(p.content)).group(1) for p in pages}
    lengths = {len(p.content) for p in pages}
    assert len(tokens) == 6
    assert len(lengths) > 1


@pytest.mark.django_db
def test_htmx_fragments_and_json_are_compressed_too(
    client, user, make_conversation, make_task
):
    client.force_login(user)
    task = make_task(
        conversation=make_conversation(owner=user),
        title="A task with a long title " * 8,
        status=Task.Status.DONE,
    )
    response = client.get(
        task.get_absolute_url(),
        headers={
            "Accept-Encoding": "gzip",
            "HX-Request": "true",
            "HX-Target": "events",
        },
    )
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert b"<html" not in gzip.decompress(response.content)
    api = client.get(reverse("api:openapi-json"), headers={"Accept-Encoding": "gzip"})
    assert api["Content-Encoding"] == "gzip"
    assert b'"openapi"' in gzip.decompress(api.content)


def test_mcp_under_a_wsgi_server_says_it_is_served_by_the_asgi_app(client):
    response = client.post("/mcp/", data="{}", content_type="application/json")
    assert response.status_code == 501
    assert "served by the ASGI application" in response.json()["error"]["message"]


def test_a_request_reaches_djangos_own_handler_and_mcp_its_own_app():
    """The router in front of both: nothing of either framework is copied."""
    from django.core.handlers.asgi import ASGIHandler

    from pippa_mcp.asgi import MCPApp
    from pippa_site.asgi import Site

    site = Site()
    assert isinstance(site.django.app, ASGIHandler)
    assert isinstance(site.mcp, MCPApp)


def test_the_connection_cap_stays_within_what_the_file_limit_leaves(monkeypatch):
    """Each connection is a socket and may spool a body to a file: at most half
    of the files left beside what the process keeps, and never above the
    setting."""
    import resource

    from pippa_site.shedding import FILES_KEPT, connection_cap

    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 256))
    assert connection_cap(1000) == (256 - FILES_KEPT) // 2
    monkeypatch.setattr(resource, "getrlimit", lambda _: (65536, 65536))
    assert connection_cap(1000) == 1000


# --- The production server: gunicorn + uvicorn with pippa_site/gunicorn_conf.py ---


def test_a_server_worker_takes_what_it_loaded_out_of_the_collectors_sight():
    """What a worker loaded before its first request (Django, the site's
    modules, their classes) is frozen: no collection walks it again, where a
    full one took 89-116 ms under load (docs/serving-and-bench.md)."""
    loaded = gunicorn_conf.PippaUvicornWorker
    assert any(obj is loaded for obj in gc.get_objects())
    try:
        gunicorn_conf.post_worker_init(worker=None)
        assert gc.get_freeze_count() > 0
        assert not any(obj is loaded for obj in gc.get_objects())
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_kib(pid: int) -> int:
    """Resident memory of gunicorn's master and its workers, in KiB."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(status.parent.name) == pid or fields.get("PPid", "").strip() == str(pid):
            total += int(fields.get("VmRSS", "0 kB").split()[0])
    return total


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of gunicorn's master and its workers."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _wait_until_idle(pid: int, seconds: float = 60) -> None:
    """Until the server has taken in what its clients sent (its CPU rests)."""
    deadline = time.monotonic() + seconds
    before = _cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_seconds(pid)
        if now - before < 0.05:
            return
        before = now


@pytest.fixture
def start_gunicorn(transactional_db, subprocess_env, python_exe, tmp_path):
    """Start gunicorn serving this test's database with the settings ``make run``
    uses (and ``env`` on top, ``files``: its file limit); return (process, port)."""
    procs: list[subprocess.Popen] = []
    collected = False

    def start(*, files: int | None = None, **extra: str):
        nonlocal collected
        env = {**subprocess_env, "PORT": str(_free_port()), "HOST": "127.0.0.1"}
        env.pop("PIPPA_PLAIN_STATIC", None)
        # Django's async-safety checks stay on in the server, as in production.
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        env["PIPPA_WEB_WORKERS"] = "1"
        env["PIPPA_TOOLS"] = "tests.support.tools"
        env.update(extra)
        if not collected:
            subprocess.run(
                [python_exe, "manage.py", "collectstatic", "--noinput", "-v", "0"],
                cwd=REPO,
                env=env,
                check=True,
                timeout=120,
            )
            collected = True

        def limit_files() -> None:
            if files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

        log = (tmp_path / f"gunicorn-{env['PORT']}.log").open("wb")
        proc = subprocess.Popen(
            [
                str(Path(python_exe).parent / "gunicorn"),
                "-c",
                "python:pippa_site.gunicorn_conf",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=limit_files,
        )
        log.close()
        procs.append(proc)
        base = f"http://127.0.0.1:{env['PORT']}"
        for _ in range(400):
            try:
                with urllib.request.urlopen(base + "/login/", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail((tmp_path / f"gunicorn-{env['PORT']}.log").read_text())
                time.sleep(0.05)
        return proc, int(env["PORT"])

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def gunicorn_server(start_gunicorn):
    """gunicorn serving this test's database with the settings ``make run`` uses."""
    return start_gunicorn()


def _get(port: int, path: str, **headers) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def _post_declaring(port: int, path: str, declared: int, send_at_most: int) -> int:
    """POST declaring ``declared`` bytes, send up to ``send_at_most``; return the status."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {declared}\r\n\r\n".encode()
    )
    chunk = b"a=" + b"x" * (1024 * 1024 - 2)
    sent = 0
    try:
        while sent < send_at_most:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the server answered and closed: what a bounded server does
    sock.settimeout(10)
    head = b""
    try:
        while b"\r\n" not in head:
            data = sock.recv(4096)
            if not data:
                break
            head += data
    except OSError:
        pass
    sock.close()
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0


@pytest.mark.slow
def test_gunicorn_serves_compressed_pages_and_immutable_compressed_static(
    gunicorn_server,
):
    _, port = gunicorn_server
    page = _get(port, "/login/", **{"Accept-Encoding": "gzip"})
    assert page.status == 200
    assert page.headers["Server"] is None  # no server banner
    assert page.headers["Content-Encoding"] == "gzip"
    html = gzip.decompress(page.body)
    css = re.search(rb'href="(/static/css/[^"]+\.css)"', html).group(1).decode()
    static = _get(port, css, **{"Accept-Encoding": "gzip"})
    assert static.status == 200
    assert "immutable" in static.headers["Cache-Control"]
    assert static.headers["Content-Encoding"] == "gzip"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "statuses"),
    [
        # Unauthenticated upload: refused before a byte of the body is read.
        ("/api/v1/tasks/1/artifacts?artifact_class=2", {401}),
        # A form larger than DATA_UPLOAD_MAX_MEMORY_SIZE: refused unread.
        ("/login/", {413}),
    ],
)
def test_a_huge_request_body_is_refused_without_the_server_buffering_it(
    gunicorn_server, path, statuses
):
    proc, port = gunicorn_server
    before = _rss_kib(proc.pid)

    status = _post_declaring(
        port, path, declared=200 * 1024 * 1024, send_at_most=100 * 1024 * 1024
    )

    assert status in statuses
    assert _rss_kib(proc.pid) - before < 48 * 1024
    assert _get(port, "/login/").status == 200


@pytest.mark.slow
def test_a_request_with_an_oversized_header_is_refused_by_the_server(
    gunicorn_server,
):
    _, port = gunicorn_server
    response = _get(port, "/login/", **{"X-Pad": "a" * 20_000})
    assert response.status in {400, 431}
    assert _get(port, "/login/").status == 200


def _timed_get(port: int, path: str, **headers) -> tuple[int, float]:
    started = time.monotonic()
    response = _get(port, path, **headers)
    return response.status, time.monotonic() - started


@pytest.mark.slow
def test_slow_clients_and_held_streams_do_not_keep_the_login_page_waiting(
    gunicorn_server, make_user
):
    """Trickled headers, trickled bodies and MCP streams cost no worker (1 process)."""
    from api.services import token_create

    _, port = gunicorn_server
    token = token_create(user=make_user(), name="agent").raw
    idle = [_timed_get(port, "/login/") for _ in range(3)]
    held: list[socket.socket] = []

    def hold(head: bytes) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(head)
        held.append(sock)

    try:
        for n in range(30):  # headers that never end
            hold(f"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-{n}: ".encode())
        for _ in range(10):  # a form body that never ends
            hold(
                b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 60000\r\n\r\nusername="
            )
        for _ in range(10):  # an MCP call whose body never ends
            hold(
                b"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: Bearer {token}\r\n".encode()
                + b"Content-Type: application/json\r\n"
                b"Accept: application/json, text/event-stream\r\n"
                b"Content-Length: 100000\r\n\r\n{"
            )
        # What every TypeScript-SDK client does after initialize, 8 times over.
        streams = [
            _timed_get(
                port,
                "/mcp/",
                Accept="text/event-stream",
                Authorization=f"Bearer {token}",
            )
            for _ in range(8)
        ]
        during = []
        for _ in range(10):
            for sock in held[::7]:
                sock.sendall(b"a")  # a byte now and then keeps each one alive
            during.append(_timed_get(port, "/login/"))
            time.sleep(0.2)
    finally:
        for sock in held:
            sock.close()

    assert [status for status, _ in idle + during] == [200] * 13
    assert_answered_promptly([seconds for _, seconds in during])
    assert {status for status, _ in streams} == {405}
    assert_answered_promptly([seconds for _, seconds in streams])
    assert _get(port, "/login/").status == 200


@pytest.fixture
def asgi_server(transactional_db):
    """The ASGI application under uvicorn, in a thread of this process."""
    from tests.support.asgi_server import ThreadedServer

    server = ThreadedServer().start()
    yield server
    server.stop()


def _request(url: str, method: str, body: bytes | None = None, **headers):
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.slow
def test_a_large_upload_and_its_download_go_through_the_asgi_server_whole(
    asgi_server, make_user, make_conversation, make_task
):
    """Past the form limit only an upload with a good token is read; the download
    streams back the same bytes."""
    from api.services import token_create

    user = make_user()
    task = make_task(conversation=make_conversation(owner=user))
    token = token_create(user=user, name="uploader").raw
    payload = bytes(range(256)) * (12 * 1024)  # 3 MiB, past the 2.5 MiB form limit
    url = f"{asgi_server.url}/api/v1/tasks/{task.pk}/artifacts?artifact_class=2"

    refused = _request(
        url,
        "POST",
        payload,
        **{"Authorization": "Bearer pip_wrong", "Content-Type": "application/pdf"},
    )
    stored = _request(
        url,
        "POST",
        payload,
        **{"Authorization": f"Bearer {token}", "Content-Type": "application/pdf"},
    )
    artifact = json.loads(stored[2])
    content = _request(
        f"{asgi_server.url}/api/v1/artifacts/{artifact['id']}/content",
        "GET",
        **{"Authorization": f"Bearer {token}"},
    )

    assert (
        refused[0],
        {k.lower(): v for k, v in refused[1].items()}.get("connection"),
    ) == (401, "close"), refused
    assert stored[0] == 201
    assert artifact["size"] == len(payload)
    assert content[0] == 200
    assert content[2] == payload


def _chunked_post(port: int, path: str, body: bytes, **headers) -> tuple[int, bytes]:
    """POST ``body`` in 64 KiB chunks (Transfer-Encoding: chunked, no length)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
    try:
        conn.request("POST", path, body=pieces, headers=headers, encode_chunked=True)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""  # the server answered early and closed
    finally:
        conn.close()


@pytest.mark.slow
def test_a_body_sent_in_chunks_reaches_the_view_and_past_a_forms_size_is_refused(
    asgi_server, make_user
):
    """A body with no Content-Length is read whole for the view, and bounded
    like a declared one: past the form limit, 413 and nothing stored."""
    from api.services import token_create
    from tasks.models import Conversation

    user = make_user()
    token = token_create(user=user, name="chunks").raw
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    # 200 KB of JSON whitespace: the body spans several chunks.
    created = _chunked_post(
        asgi_server.port,
        "/api/v1/conversations",
        b'{"title": "Sent in chunks"' + b" " * 200_000 + b"}",
        **headers,
    )
    huge = _chunked_post(
        asgi_server.port,
        "/api/v1/conversations",
        b'{"title": "Too large"' + b" " * (3 * 1024 * 1024) + b"}",
        **headers,
    )

    assert created[0] == 201, created
    assert json.loads(created[1])["title"] == "Sent in chunks"
    assert huge[0] in {413, 0}, huge  # 0: it closed while the client still sent
    if huge[0]:
        assert json.loads(huge[1]) == {"detail": "request body too large"}
    titles = Conversation.objects.filter(owner=user).values_list("title", flat=True)
    assert list(titles) == ["Sent in chunks"]
    assert _request(f"{asgi_server.url}/login/", "GET")[0] == 200


@pytest.mark.slow
def test_a_download_stops_being_read_once_its_client_leaves(
    asgi_server, make_user, monkeypatch
):
    """The server reads a blob a chunk at a time as it sends it; a client that
    leaves after the first bytes ends the reading, and the answer is closed."""
    from api.services import token_create
    from artifacts.models import ArtifactClass
    from artifacts.services import artifact_store
    from artifacts.store import BlobStore

    user = make_user()
    token = token_create(user=user, name="reader").raw
    size = 64 * 1024 * 1024
    artifact = artifact_store(
        owner=user,
        stream=(bytes([n]) * (1024 * 1024) for n in range(64)),
        media_type="application/octet-stream",
        artifact_class=ArtifactClass.SNAPSHOT,
    )
    chunks_read: list[int] = []
    closed = threading.Event()
    original = BlobStore.iter_chunks

    def counting(self, sha, chunk_size=64 * 1024):
        try:
            for chunk in original(self, sha, chunk_size):
                chunks_read.append(len(chunk))
                yield chunk
        finally:
            closed.set()

    monkeypatch.setattr(BlobStore, "iter_chunks", counting)

    sock = socket.create_connection(("127.0.0.1", asgi_server.port), timeout=10)
    sock.sendall(
        f"GET /api/v1/artifacts/{artifact.pk}/content HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    received = b""
    while len(received) < 256 * 1024:
        received += sock.recv(65536)
    sock.close()

    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    assert closed.wait(10), "the download was not closed after its client left"
    assert sum(chunks_read) < size // 2, sum(chunks_read)


# --- What the server sheds (the audit of b2149bc, one test a finding) -------------


def _login_status(port: int) -> tuple[int, float]:
    """GET /login/ on a fresh connection: (status, seconds); (0, s) if it failed."""
    started = time.monotonic()
    try:
        return _get(port, "/login/").status, time.monotonic() - started
    except OSError:
        return 0, time.monotonic() - started


class LoginProbe:
    """Ask for /login/ every 0.2 s in a thread until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            self.answers.append(_login_status(self.port))

    def __enter__(self) -> LoginProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def assert_prompt(self) -> None:
        assert self.answers, "no probe was sent"
        assert {status for status, _ in self.answers} == {200}, self.answers
        assert_answered_promptly([seconds for _, seconds in self.answers])


def _connect(port: int, head: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if head:
        sock.sendall(head)
    return sock


def _first_bytes(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before it closed, or None if it kept the socket open."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except OSError:
        pass  # reset: closed
    return data


@pytest.mark.slow
def test_every_phase_a_client_controls_has_a_deadline(
    start_gunicorn, make_user, settings
):
    """The audit held 200 idle, header-trickling, body-trickling and never-reading
    connections for 75 s and none was closed. Each phase now has its deadline
    (1 s here): an idle socket is closed, a trickled head or body is answered
    408, an answer left unread is dropped; the login page answers meanwhile."""
    from api.services import token_create
    from artifacts.models import ArtifactClass
    from artifacts.services import artifact_store

    _, port = start_gunicorn(
        PIPPA_HEAD_SECONDS="1",
        PIPPA_BODY_SECONDS="1",
        PIPPA_ANSWER_SECONDS="1",
        PIPPA_BODY_MIN_RATE="1000000",
    )
    user = make_user()
    token = token_create(user=user, name="reader").raw
    size = 32 * 1024 * 1024
    artifact = artifact_store(
        owner=user,
        stream=(bytes([n]) * (1024 * 1024) for n in range(32)),
        media_type="application/octet-stream",
        artifact_class=ArtifactClass.SNAPSHOT,
    )
    with LoginProbe(port) as probe:
        idle = _connect(port)
        head = _connect(port, b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        body = _connect(
            port,
            b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 60000\r\n\r\nusername=",
        )
        unread = _connect(
            port,
            f"GET /api/v1/artifacts/{artifact.pk}/content HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode(),
        )
        unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        for _ in range(15):  # a byte every 0.2 s: never idle, always late
            time.sleep(0.2)
            for sock in (head, body):
                try:
                    sock.sendall(b"a")
                except OSError:
                    pass
        answers = {
            name: _first_bytes(sock, timeout=5)
            for name, sock in (("idle", idle), ("head", head), ("body", body))
        }
        got = _first_bytes(unread, timeout=10)
    for sock in (idle, head, body, unread):
        sock.close()

    assert answers["idle"] == b""
    assert answers["head"].startswith(b"HTTP/1.1 408"), answers["head"]
    assert answers["body"].startswith(b"HTTP/1.1 408"), answers["body"]
    assert got is not None, "the unread answer's connection was kept open"
    assert got.startswith(b"HTTP/1.1 200")
    assert len(got) < size
    probe.assert_prompt()


def _hold_body(port: int, declared: int, send: int) -> socket.socket:
    """A form POST to /login/ declaring ``declared`` bytes, of which ``send`` come."""
    sock = _connect(
        port,
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode(),
    )
    sock.sendall(b"a=" + b"x" * (send - 2))
    return sock


@pytest.mark.slow
def test_held_bodies_cost_the_web_process_little_memory(start_gunicorn):
    """The audit: 100 clients each sending all but the last bytes of a 2.5 MiB
    form to /login/, without logging in, took the web process from 132 to 498 MB
    (200: 830 MB). Now such a body is refused before it is read (a client that
    has not signed in sends at most PIPPA_MAX_ANONYMOUS_BODY_BYTES), and 200
    bodies as large as it may send, held unfinished, keep the process within
    1.5x its idle memory while the login page answers."""
    from concurrent.futures import ThreadPoolExecutor

    from django.conf import settings

    proc, port = start_gunicorn()
    for _ in range(20):
        assert _get(port, "/login/").status == 200
    idle = _rss_kib(proc.pid)

    audit = _connect(
        port,
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: 2600000\r\n\r\n",
    )
    answer = _first_bytes(audit, timeout=10)
    audit.close()
    assert answer is not None
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:80]

    declared = settings.PIPPA_MAX_ANONYMOUS_BODY_BYTES
    with ThreadPoolExecutor(20) as pool:
        held = list(
            pool.map(lambda _: _hold_body(port, declared, declared - 100), range(200))
        )
    try:
        _wait_until_idle(proc.pid)
        with LoginProbe(port) as probe:
            time.sleep(3)
        during = _rss_kib(proc.pid)
    finally:
        for sock in held:
            sock.close()

    probe.assert_prompt()
    assert during <= 1.5 * idle, f"{idle // 1024} MiB idle, {during // 1024} MiB held"


@pytest.mark.slow
def test_idle_sockets_under_a_low_file_limit_leave_the_login_page_answering(
    start_gunicorn,
):
    """The audit: with a file limit of 256, 250 idle sockets made every /login/
    time out ("Too many open files"). The connection cap keeps the process
    within its files, shedding the sockets that waited longest for a request."""
    proc, port = start_gunicorn(files=256)
    held = [_connect(port) for _ in range(250)]
    try:
        with LoginProbe(port) as probe:
            time.sleep(4)
    finally:
        for sock in held:
            sock.close()
    probe.assert_prompt()


def _post_json(port: int, path: str, token: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
    )
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}


@pytest.mark.slow
def test_one_users_step_runs_are_capped_and_leave_the_pages_answering(
    start_gunicorn, make_user, make_conversation, tool_log
):
    """The audit: 12 concurrent step runs of one token held every page thread and
    /login/ stopped answering while they ran. Now each user runs at most
    PIPPA_STEP_RUNS_PER_USER (2) at once, the rest answered 429 with
    Retry-After, and no page waits on a step."""
    from concurrent.futures import ThreadPoolExecutor

    from api.services import token_create
    from tasks.plan import task_create

    _, port = start_gunicorn(PIPPA_TOOL_LOG=str(tool_log))
    user = make_user()
    token = token_create(user=user, name="runner").raw
    conversation = make_conversation(owner=user)
    tasks = [
        task_create(
            conversation=conversation,
            title=f"slow {n}",
            steps=[{"title": "slow", "tool": "test.fetch", "args": {"sleep": 3}}],
        )
        for n in range(12)
    ]
    with LoginProbe(port) as probe, ThreadPoolExecutor(12) as pool:
        answers = list(
            pool.map(
                lambda task: _post_json(
                    port, f"/api/v1/tasks/{task.pk}/steps/run", token, {"worker": "w"}
                ),
                tasks,
            )
        )
        time.sleep(0.5)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 2 + [429] * 10, answers
    assert all(int(h["retry-after"]) > 0 for s, h in answers if s == 429)
    probe.assert_prompt()
