"""Shared fixtures (plain factories, data dirs, subprocess env) and the test rules.

The rules: a fast password hasher for every test but the one that checks the
real one, and a marker on every test that starts a process, a server or a
browser, so the fast suite (``make test``) never starts one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import caches
from django.db import connection
from django.test import override_settings

from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from artifacts.store import BlobStore, FolderStore, default_store
from tasks.tools import tools_load
from tests.support.faults import Tmpfs, TmpfsUnavailable
from tests.support.workers import worker_argv

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT_DIR = REPO / "var" / "screenshots"

# What a test may start only with a marker (the fast suite deselects them):
# fixtures that start our server (the site, the MCP server), a browser or a
# child process, or only exist to hand one its environment. A stand-in for a
# vendor or a mail server on loopback (tests.support.fake_vendors, .receivers)
# is a thread of the test, not a server it starts (docs/contributing.md).
STARTS_SOMETHING = {
    "live_server",  # Django's threaded server
    "subprocess_env",
    "python_exe",
    "worker",
    "server_env",
    "stdio_session",
    "http_server",
    "mcp_url",
    "asgi_server",  # uvicorn serving pippa_site.asgi, in a thread
    "logged_in_page",
    "page",  # pytest-playwright's
    "context",
    "browser",
}
MAY_START_SOMETHING = {"slow", "browser"}
# Children a fast test may start: mounting a size-capped tmpfs (``tmpfs``),
# and the sandboxed preview renderer the site itself starts for every picture.
FAST_COMMANDS = {"mount", "umount"}
FAST_SCRIPTS = {"render_worker.py"}
FAST_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Playwright's sync API runs an event loop in the test thread; Django's ORM
# would refuse to run there without this.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_configure(config):
    sys.addaudithook(_refuse_unmarked_processes)


# The test being run now, for the audit hook below (one per xdist worker).
_running: dict[str, pytest.Item | None] = {"item": None}


def _may_start_something(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in MAY_START_SOMETHING)


def _refuse_unmarked_processes(event: str, args: tuple) -> None:
    """A test without ``slow``/``browser`` that starts a child process fails."""
    item = _running["item"]
    if event != "subprocess.Popen" or item is None or _may_start_something(item):
        return
    executable, argv = args[0], args[1]
    if executable is None:
        executable = argv if isinstance(argv, str | bytes) else argv[0]
    words = [argv] if isinstance(argv, str | bytes) else list(argv)
    if Path(os.fsdecode(executable)).name in FAST_COMMANDS or any(
        Path(os.fsdecode(word)).name in FAST_SCRIPTS for word in words
    ):
        return
    message = (
        f"{item.nodeid} started a process ({os.fsdecode(executable)}) "
        "without @pytest.mark.slow (or browser): the fast suite must not"
    )
    item.stash[_UNMARKED] = message
    raise RuntimeError(message)


_UNMARKED = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running["item"] = item
    try:
        return (yield)
    finally:
        _running["item"] = None


@pytest.fixture(autouse=True)
def _no_unmarked_process(request):
    """Fail the test even when the code under test swallowed the RuntimeError."""
    yield
    if _UNMARKED in request.node.stash:
        pytest.fail(request.node.stash[_UNMARKED], pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hasher():
    """MD5 instead of PBKDF2 (1.5 M rounds, ~370 ms a user) for every test.

    ``tests/test_auth.py`` puts the real hashers back to prove a login with them.
    """
    with override_settings(PASSWORD_HASHERS=FAST_PASSWORD_HASHERS):
        yield


@pytest.fixture(autouse=True)
def _empty_default_cache():
    """Every test starts with an empty default cache: a page's counts are kept
    there by user id and version, and a new test database reuses both."""
    caches["default"].clear()


@pytest.fixture(autouse=True)
def _isolated_blobs(settings, tmp_path):
    """Every test gets its own blob folder (and the folder store: only
    ``any_store`` puts a test on a bucket), and its own slots folder: the
    host's slots are files, and two tests' users may have the same id."""
    settings.BLOB_DIR = tmp_path / "blobs"
    settings.PIPPA_SLOTS_DIR = tmp_path / "slots"
    settings.PIPPA_BLOB_URL = ""
    settings.WHITENOISE_AUTOREFRESH = True
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {
            "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        },
    }
    return settings.BLOB_DIR


class StubResolver:
    """Names resolved by a table, never by the network: a notification
    address's host is looked up here (``notifications.safety.resolve``), so a
    test can have a public name, a private one, or one that changes what it
    resolves to, without a packet leaving the machine. An unknown name does
    not resolve."""

    def __init__(self) -> None:
        self.names: dict[str, list[str]] = {
            "localhost": ["127.0.0.1"],
            # Public names the tests save (documentation's own addresses
            # would be refused as not public, so these are plain strings).
            "ntfy.sh": ["159.203.148.75"],
            "smtp.example.org": ["93.184.215.14"],
            "matrix.example.org": ["93.184.215.14"],
        }
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[str]:
        self.asked.append(host)
        found = self.names.get(host.lower().rstrip("."))
        if found is None:
            raise OSError(f"stub resolver: {host} is unknown")
        return list(found)


@pytest.fixture(autouse=True)
def resolver(monkeypatch) -> StubResolver:
    """Every test resolves notification hosts through ``StubResolver``."""
    stub = StubResolver()
    monkeypatch.setattr("notifications.safety.resolve", stub)
    return stub


@pytest.fixture
def blob_store(settings) -> FolderStore:
    return FolderStore(settings.BLOB_DIR)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory, worker_id):
    """A real S3-compatible server (SeaweedFS), one for the whole run: the
    xdist workers share it (``tests.support.seaweed.shared``). Skipped, saying
    why, only where ``weed`` cannot start."""
    from tests.support.seaweed import WeedUnavailable, shared

    base = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        base = base.parent  # the run's folder, the same for every worker
    try:
        with shared(base / "seaweedfs") as server:
            yield server
    except WeedUnavailable as exc:
        pytest.skip(f"SeaweedFS could not start here: {exc}")


@pytest.fixture(params=["folder", pytest.param("s3", marks=pytest.mark.slow)])
def any_store(request, settings, monkeypatch) -> BlobStore:
    """The configured blob store, once as the local folder (the default) and
    once as a prefix of its own in a SeaweedFS bucket (``PIPPA_BLOB_URL``):
    for the tests about what every store must do. The S3 run is slow (it
    starts a server once per run)."""
    if request.param == "s3":
        import uuid

        from tests.support.seaweed import BUCKET, s3_variables

        server = request.getfixturevalue("seaweedfs")
        for name, value in s3_variables(server.endpoint).items():
            monkeypatch.setenv(name, value)
        settings.PIPPA_BLOB_URL = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    else:
        settings.PIPPA_BLOB_URL = ""
    return default_store()


@pytest.fixture
def tool_log(monkeypatch, tmp_path) -> Path:
    """Load the test tools; return the file their calls are logged to.

    The log's path is in the environment, so a server or worker process this
    test starts logs its calls to the same file (``tests.support.executing.invocations``).
    """
    tools_load(["tests.support.tools"])
    log = tmp_path / "tool-calls.jsonl"
    monkeypatch.setenv("PIPPA_TOOL_LOG", str(log))
    return log


def is_sqlite() -> bool:
    return connection.vendor == "sqlite"


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def subprocess_env(settings, tmp_path):
    """Environment for a child process that must see this test's DB and blobs.

    Use with ``transactional_db`` so the rows a test writes are committed.
    """
    db = connection.settings_dict
    # Not this process's metrics folder either: a child counts into its own
    # data folder's unless a test hands it one.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "PIPPA_BLOB_URL", "PROMETHEUS_MULTIPROC_DIR"}
    }
    env["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    env["PIPPA_DATA_DIR"] = str(tmp_path / "child-data")
    env["PIPPA_BLOB_DIR"] = str(settings.BLOB_DIR)
    if settings.PIPPA_BLOB_URL:  # any_store's S3 run: its bucket and endpoint
        env["PIPPA_BLOB_URL"] = settings.PIPPA_BLOB_URL
    env["PYTHONPATH"] = str(REPO)
    env["SECRET_KEY"] = "test-only-secret-key-for-child-processes-0123456789"
    if db["ENGINE"].endswith("sqlite3"):
        env["PIPPA_SQLITE_PATH"] = str(db["NAME"])
    else:
        user = db.get("USER") or ""
        password = db.get("PASSWORD") or ""
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        env["DATABASE_URL"] = (
            f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
        )
    return env


@pytest.fixture
def tmpfs(tmp_path):
    """Make size-capped tmpfs mounts (a disk that really fills); skip where not allowed."""
    made: list[Tmpfs] = []

    def make(name: str = "fs", size: int = 4 * 1024 * 1024) -> Tmpfs:
        fs = Tmpfs(tmp_path / name, size)
        try:
            fs.mount()
        except TmpfsUnavailable as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        made.append(fs)
        return fs

    yield make
    for fs in made:
        fs.unmount()


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def make_user(django_user_model):
    counter = {"n": 0}

    def make(**kwargs):
        counter["n"] += 1
        kwargs.setdefault("username", f"user{counter['n']}")
        kwargs.setdefault("password", "correct horse battery staple")
        return django_user_model.objects.create_user(**kwargs)

    return make


@pytest.fixture
def user(make_user):
    return make_user(username="dad")


@pytest.fixture
def dad_client(client, user):
    """The test client, logged in as ``user``."""
    client.force_login(user)
    return client


@pytest.fixture
def operator(make_user):
    """A superuser, the site's operator."""
    return make_user(username="operator", is_staff=True, is_superuser=True)


@pytest.fixture
def staff_client(client, operator):
    """The test client, logged in as ``operator`` (``staff_client.user``)."""
    client.force_login(operator)
    client.user = operator
    return client


@pytest.fixture
def make_conversation(make_user):
    from tasks.models import Conversation

    def make(**kwargs):
        if "owner" not in kwargs:
            kwargs["owner"] = make_user()
        kwargs.setdefault("title", "A conversation")
        return Conversation.objects.create(**kwargs)

    return make


@pytest.fixture
def make_task(make_conversation):
    from tasks.models import Task

    def make(**kwargs):
        if "conversation" not in kwargs:
            kwargs["conversation"] = make_conversation()
        kwargs.setdefault("title", "A task")
        return Task.objects.create(**kwargs)

    return make


@pytest.fixture
def make_artifact(make_user):
    """Store an artifact; its owner is ``owner=`` or one default user per test."""
    counter = {"n": 0}
    default_owner = []

    def make(**kwargs):
        counter["n"] += 1
        if "owner" not in kwargs:
            if not default_owner:
                default_owner.append(make_user(username="artifact-owner"))
            kwargs["owner"] = default_owner[0]
        kwargs.setdefault("data", f"payload {counter['n']}".encode())
        kwargs.setdefault("media_type", "text/plain")
        kwargs.setdefault("artifact_class", ArtifactClass.SNAPSHOT)
        kwargs.setdefault("title", f"artifact {counter['n']}")
        return artifact_store(**kwargs)

    return make


# -- browser tests -----------------------------------------------------------


def pytest_collection_modifyitems(config, items):
    """Refuse unmarked tests that start something; skip browser tests, loudly,
    where Debian's chromium is not installed."""
    unmarked = [
        f"{item.nodeid} (uses {', '.join(sorted(STARTS_SOMETHING & set(item.fixturenames)))})"
        for item in items
        if STARTS_SOMETHING & set(item.fixturenames) and not _may_start_something(item)
    ]
    if unmarked:
        raise pytest.UsageError(
            "These tests start a server, a browser or a process but carry neither "
            "@pytest.mark.slow nor @pytest.mark.browser, so the fast suite would "
            "run them:\n  " + "\n  ".join(unmarked)
        )
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason="no /usr/bin/chromium (run .ci/install-chromium)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": str(CHROMIUM),
        "args": [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }


@pytest.fixture
def worker(subprocess_env):
    """Start ``pippa_worker --until-idle`` for some tasks in a child process."""
    children = []

    def start(
        *task_ids: int, worker_id: str = "worker:browser-test"
    ) -> subprocess.Popen:
        child = subprocess.Popen(
            worker_argv(*task_ids, worker_id=worker_id, poll=0.2, quiet=False),
            cwd=REPO,
            env=subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.terminate()
        child.wait(timeout=30)


@pytest.fixture
def screenshot():
    """Save a screenshot under var/screenshots (never committed) and return its path."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SCREENSHOT_DIR / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def logged_in_page(page, live_server, make_user):
    """A Playwright page logged in as a fresh user; ``page.user`` is that user."""
    user = make_user(username="dad-browser")
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "correct horse battery staple")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    page.user = user
    page.base_url = live_server.url
    return page


@pytest.fixture(scope="session", autouse=True)
def _no_stray_database_sessions(django_db_setup, django_db_blocker):
    """End other sessions on the PostgreSQL test database before it is dropped.

    Threads the tests start (the live server's, a runner's, the lease keeper)
    may still hold a connection when the session ends, and PostgreSQL refuses
    to drop a database that is in use.
    """
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock():
        # A fault test may have cut this very session (pg_terminate_backend);
        # a fresh one is sure to answer.
        connection.close()
        cursor = connection.cursor()
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
