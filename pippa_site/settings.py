"""Settings for Pippa Stateful, read from the environment.

Every knob has a default that lets a fresh checkout run: SQLite in the data
dir, a secret key generated once and kept there, DEBUG off. The table in
docs/configuration.md lists the variables. Two settings are not variables:
PIPPA_BEARER_AUTHENTICATE and PIPPA_MCP_APP name the doors the ground reaches
without importing an app.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value and value.strip() else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


DATA_DIR = Path(env_str("PIPPA_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)
DATA_DIR.chmod(0o700)  # the service's account only, whatever the umask
BLOB_DIR = Path(env_str("PIPPA_BLOB_DIR", str(DATA_DIR / "blobs"))).resolve()
# Blobs in an S3-compatible bucket instead of BLOB_DIR: s3://bucket/prefix, with
# the endpoint and credentials from boto3's own variables (AWS_ENDPOINT_URL_S3 or
# AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION).
# Workers on several hosts then share only the database and the bucket
# (docs/hosts.md).
PIPPA_BLOB_URL = env_str("PIPPA_BLOB_URL")
if PIPPA_BLOB_URL and not re.match(
    r"\As3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/|\Z)", PIPPA_BLOB_URL
):
    raise ValueError(
        "PIPPA_BLOB_URL must be s3://bucket or s3://bucket/prefix "
        "(a bucket name of 3-63 lowercase letters, digits, dots and hyphens)"
    )

# Metrics (pippa_site.metrics): every process of a host writes its counters to
# this folder (prometheus-client's multiprocess mode); a scrape of /metrics adds
# them up. Emptied by `make run` before it starts the host's processes.
PIPPA_METRICS_DIR = Path(
    env_str("PROMETHEUS_MULTIPROC_DIR", str(DATA_DIR / "metrics"))
).resolve()
PIPPA_METRICS_DIR.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(PIPPA_METRICS_DIR)
# A Prometheus server's bearer token for /metrics (staff may read it signed in).
PIPPA_METRICS_TOKEN = env_str("PIPPA_METRICS_TOKEN")


def _secret_key() -> str:
    """Return SECRET_KEY from the environment, or one kept in the data dir."""
    from_env = env_str("SECRET_KEY")
    if from_env:
        return from_env
    key_file = DATA_DIR / "secret_key"
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(50)
    # O_EXCL: two processes starting at once must agree on one key.
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return key_file.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# Behind TLS (PIPPA_HTTPS=1) every cookie is secure and plain HTTP redirects.
# Off by default so `make run` works on http://127.0.0.1:8000.
HTTPS = env_bool("PIPPA_HTTPS")
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = 31536000 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
PIPPA_BEHIND_PROXY = env_bool("PIPPA_BEHIND_PROXY")
if PIPPA_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "axes",
    "artifacts",
    "tasks",
    "council",
    "notifications",
    "dashboard",
    "brains",
    "api",
    "pippa_mcp",
]

MIDDLEWARE = [
    # Outermost: times every request by door (pippa_site.metrics).
    "pippa_site.middleware.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files answer here, already compressed (whitenoise keeps .gz/.br).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Compresses on the way out, after everything below has written the body.
    # Django's GZip adds random bytes per response against BREACH, and the CSRF
    # token in pages is masked anew per response; payloads are left alone
    # (see pippa_site/middleware.py).
    "pippa_site.middleware.TextGZipMiddleware",
    "pippa_site.middleware.SessionCookieGuardMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "pippa_site.middleware.TextGuardMiddleware",
    # Last, as django-axes asks: it turns a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "pippa_site.urls"
WSGI_APPLICATION = "pippa_site.wsgi.application"
ASGI_APPLICATION = "pippa_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csp",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Untrusted model output (widget SVG/HTML) is never inlined; previews are PNGs
# served from our own origin. Scripts need a nonce, styles come from files.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}


def _database() -> dict:
    url = env_str("DATABASE_URL")
    if url:
        import dj_database_url

        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        if config["ENGINE"] != "django.db.backends.postgresql":
            raise ValueError("DATABASE_URL must point at PostgreSQL (postgres://…)")
        # A commit returns once it is on the server's disk, whatever the
        # server's own default: the executor's envelope relies on it.
        options = config.setdefault("OPTIONS", {})
        options["options"] = (
            options.get("options", "") + " -c synchronous_commit=on"
        ).strip()
        if env_str("PIPPA_TEST_DB_NAME"):
            config["TEST"] = {"NAME": env_str("PIPPA_TEST_DB_NAME")}
        return config
    # FULL (the default): every commit is on disk when it returns, except the
    # one that logs the start of a call without outside effects (the executor
    # runs that one at NORMAL: losing it re-runs a call nobody saw). NORMAL
    # opts into less: any other commit of the last moments before a power cut
    # may be lost (a person's action, a new task), never a result shown or
    # the start of a call with outside effects, which the executor syncs at
    # every setting (docs/faults.md, "Power loss").
    synchronous = env_str("PIPPA_SQLITE_SYNCHRONOUS", "FULL").upper()
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError("PIPPA_SQLITE_SYNCHRONOUS must be NORMAL or FULL")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": env_str("PIPPA_SQLITE_PATH", str(DATA_DIR / "pippa.sqlite3")),
        "OPTIONS": {
            # Django switches foreign keys on for every new SQLite connection;
            # WAL lets readers run beside the writer; IMMEDIATE takes the write
            # lock at BEGIN so two writers queue instead of failing mid-way.
            "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous};",
            "transaction_mode": "IMMEDIATE",
            # Busy timeout: how long a writer waits for the write lock before
            # "database is locked" (a worker then backs off and tries again).
            "timeout": env_float("PIPPA_SQLITE_TIMEOUT", 30.0),
        },
        # One connection per server thread, kept between requests: opening a
        # SQLite connection (Django registers its SQL functions and runs the
        # pragmas each time) costs more than a small page's own queries.
        "CONN_MAX_AGE": env_int("PIPPA_CONN_MAX_AGE", 600),
        "TEST": {
            # A file, not :memory:, so worker subprocesses in tests share it;
            # one per test run, so two runs on one checkout do not collide.
            "NAME": env_str(
                "PIPPA_TEST_SQLITE_PATH", str(DATA_DIR / f"test-{os.getpid()}.sqlite3")
            ),
        },
    }


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {
        "NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"
    },
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Django's database sessions and ModelBackend; django-axes first, which
# throttles the dashboard and admin logins alike (the API's bearer tokens use
# the same counters: pippa_site.throttle).
SESSION_ENGINE = "django.contrib.sessions.backends.db"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("PIPPA_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("PIPPA_LOGIN_COOLOFF_MINUTES", 15))
# A name tried from one address: a stranger guessing Dad's password locks only
# that pair, not Dad on his own machine.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# A try refused during a lockout is not counted, so nobody sharing Dad's address
# can keep him locked out by trying again: the cool-off runs from the failure
# that locked.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "pippa_site.throttle.lockout_response"
AXES_CLIENT_IP_CALLABLE = "pippa_site.throttle.client_ip"
AXES_VERBOSE = False

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
# The site speaks English only (no LocaleMiddleware, no catalogues of its own),
# so Django's translation machinery stays off: with it on, every date filter,
# {% url %} and choice label asks for the active language through a
# process-wide lock (asgiref's Local), a few hundred times per task page, and
# under the web process's threads that lock was a queue. Strings, dates and
# number formats come out the same (en-us).
USE_I18N = False
USE_TZ = True

# Per process, in memory. "fragments" holds the task page's drawn step rows
# ({% cache %} in dashboard/task_detail.html), each under a key made of all it
# shows (dashboard.selectors.timeline.StepRow.fragment_key): a few KiB a row,
# the oldest dropped past the cap.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "fragments": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "fragments",
        "OPTIONS": {"MAX_ENTRIES": env_int("PIPPA_FRAGMENT_ENTRIES", 5000)},
    },
}

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG and not env_bool("PIPPA_PLAIN_STATIC")
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# Request bodies. Django's ASGI handler reads a body whole before the view
# runs: in memory up to FILE_UPLOAD_MAX_MEMORY_SIZE, then spooled to a
# temporary file, so a held or trickled body costs little memory whoever sends
# it. The router (pippa_site/asgi.py) refuses a body larger than a form (413)
# before reading it, except the API's upload once its token has passed, up to
# PIPPA_MAX_UPLOAD_BYTES. Django reads at most DATA_UPLOAD_MAX_MEMORY_SIZE of a
# form or JSON body into memory (more is a 400).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("PIPPA_MAX_FORM_BYTES", 2_621_440)
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
DATA_UPLOAD_MAX_NUMBER_FILES = 10
FILE_UPLOAD_MAX_MEMORY_SIZE = env_int("PIPPA_BODY_MEMORY_BYTES", 64 * 1024)
# A client that has not signed in (no session with a user, no token that
# passes) sends at most this much: a login form, a sign-in request. Larger
# is a 413 before the body is read, so clients that never signed in cannot
# keep the server reading bodies (docs/serving-and-bench.md).
PIPPA_MAX_ANONYMOUS_BODY_BYTES = env_int("PIPPA_MAX_ANONYMOUS_BODY_BYTES", 64 * 1024)

# The server's bounds per web process (pippa_site/shedding.py): the request
# head must be in within PIPPA_HEAD_SECONDS of the connection (or the last
# answer); the body within PIPPA_BODY_SECONDS plus a second per
# PIPPA_BODY_MIN_RATE bytes received; a client that leaves the answer unread
# for PIPPA_ANSWER_SECONDS is dropped; past PIPPA_MAX_CONNECTIONS open
# connections (fewer when the file limit is low) the one idle longest goes, or
# the new one is answered 503.
PIPPA_HEAD_SECONDS = env_float("PIPPA_HEAD_SECONDS", 10.0)
PIPPA_BODY_SECONDS = env_float("PIPPA_BODY_SECONDS", 20.0)
PIPPA_BODY_MIN_RATE = env_int("PIPPA_BODY_MIN_RATE", 8 * 1024)
PIPPA_ANSWER_SECONDS = env_float("PIPPA_ANSWER_SECONDS", 30.0)
PIPPA_MAX_CONNECTIONS = env_int("PIPPA_MAX_CONNECTIONS", 1000)
# Threads kept for Django's requests in a web process, idle between requests,
# each with its database connection (pippa_site.request_threads.RequestThreads).
PIPPA_REQUEST_THREADS = env_int("PIPPA_REQUEST_THREADS", 8)

# MCP over HTTP (pippa_mcp/asgi.py): threads for tool calls (per web process),
# the largest request body, and each user's calls in flight on the host (429
# past it).
PIPPA_MCP_THREADS = env_int("PIPPA_MCP_THREADS", 8)
PIPPA_MCP_MAX_BODY_BYTES = env_int("PIPPA_MCP_MAX_BODY_BYTES", 4 * 1024 * 1024)
PIPPA_MCP_CALLS_PER_USER = env_int("PIPPA_MCP_CALLS_PER_USER", 4)
# Step runs asked over the API or MCP (pippa_site/slots.py), per host (all its
# web processes together): each user's in flight (429 past it) and all users'
# (503 past it). A step run never takes a page's thread: Django gives every
# request its own, and MCP's step runs leave the tool threads alone.
PIPPA_STEP_RUNS_PER_USER = env_int("PIPPA_STEP_RUNS_PER_USER", 2)
PIPPA_STEP_RUNS = env_int("PIPPA_STEP_RUNS", 8)
# The host's slot files for those bounds and PIPPA_MCP_CALLS_PER_USER: a call
# in flight holds a lock on one (pippa_site/slots.py).
PIPPA_SLOTS_DIR = Path(env_str("PIPPA_SLOTS_DIR", str(DATA_DIR / "slots"))).resolve()
# The doors the ground (pippa_site) reaches without importing an app: the
# authenticator of a bearer token checked before Django (pippa_site/bearer.py,
# a large API upload) and the ASGI app that answers /mcp/ (pippa_site/asgi.py).
PIPPA_BEARER_AUTHENTICATE = "api.services.token_authenticate"
PIPPA_MCP_APP = "pippa_mcp.asgi.MCPApp"
# Active API tokens a user may hold at once.
PIPPA_TOKENS_PER_USER = env_int("PIPPA_TOKENS_PER_USER", 10)
# An MCP sign-in's access token lasts this long; the client refreshes it.
PIPPA_OAUTH_ACCESS_SECONDS = env_int("PIPPA_OAUTH_ACCESS_SECONDS", 3600)

# Executor knobs.
PIPPA_LEASE_SECONDS = env_int("PIPPA_LEASE_SECONDS", 60)
PIPPA_MAX_ATTEMPTS = env_int("PIPPA_MAX_ATTEMPTS", 3)
# Back-off before the next attempt of a failed tool: base * 2**(n-1), capped,
# jittered to between half and all of it (tasks.faults.backoff_delay).
PIPPA_RETRY_BASE_SECONDS = env_float("PIPPA_RETRY_BASE_SECONDS", 5.0)
PIPPA_RETRY_MAX_SECONDS = env_float("PIPPA_RETRY_MAX_SECONDS", 300.0)
# The same rule for a worker waiting out a full disk or a lost database.
PIPPA_FAULT_BASE_SECONDS = env_float("PIPPA_FAULT_BASE_SECONDS", 1.0)
PIPPA_FAULT_MAX_SECONDS = env_float("PIPPA_FAULT_MAX_SECONDS", 60.0)
PIPPA_TOOLS = env_list("PIPPA_TOOLS")
# Class-1 tools write their files here (externally persisted outputs); unset,
# a "files" folder beside the blob folder.
PIPPA_FILES_DIR = env_str("PIPPA_FILES_DIR") or None
# The doctor leaves blob and temp files younger than this alone (in-flight writes).
PIPPA_DOCTOR_GRACE_SECONDS = env_int("PIPPA_DOCTOR_GRACE_SECONDS", 3600)
# Largest request body an upload may stream into the blob store.
PIPPA_MAX_UPLOAD_BYTES = env_int("PIPPA_MAX_UPLOAD_BYTES", 256 * 1024 * 1024)
# Bytes of payloads each user's artifact rows may name, unless staff set the
# user's own quota (artifacts.quota); 0: no limit.
PIPPA_QUOTA_BYTES = env_int("PIPPA_QUOTA_BYTES", 5 * 1024**3)
# The Messages API version the Anthropic adapter asks for (the anthropic-version
# header): the one Anthropic's own Python SDK sends as of anthropic 2.14.
PIPPA_ANTHROPIC_VERSION = env_str("PIPPA_ANTHROPIC_VERSION", "2026-10-21")

# Notifications: a step that starts waiting for a person tells its owner
# (notifications.outbox, docs/notifications.md). The site's Apprise URLs, comma
# separated: a mailto:// or mailtos:// one is the mail server through which
# users' e-mail addresses are reached. A comma inside one URL (to=a,b) stays.
PIPPA_NOTIFY_URLS = [
    url.strip(" ,")
    for url in re.split(
        r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)", env_str("PIPPA_NOTIFY_URLS")
    )
    if url.strip(" ,")
]


def _site_url() -> str:
    """Where links in messages point: PIPPA_SITE_URL, or the first plain allowed host."""
    hosts = [h for h in ALLOWED_HOSTS if h not in ("*",) and not h.startswith(".")]
    scheme = "https" if HTTPS else "http"
    return f"{scheme}://{(hosts or ['127.0.0.1'])[0]}:{env_int('PORT', 8000)}"


PIPPA_SITE_URL = (env_str("PIPPA_SITE_URL") or _site_url()).rstrip("/")
# A first notice waits this long for others to go in the same message; after a
# message, an owner's next one waits out the window (several decisions within
# a few minutes become one message).
PIPPA_NOTIFY_DELAY_SECONDS = env_float("PIPPA_NOTIFY_DELAY_SECONDS", 30.0)
PIPPA_NOTIFY_WINDOW_SECONDS = env_float("PIPPA_NOTIFY_WINDOW_SECONDS", 300.0)
# A message that could not be sent is tried again after base * 2**(n-1),
# capped, jittered (tasks.faults.backoff_delay), for as long as its step waits.
PIPPA_NOTIFY_RETRY_BASE_SECONDS = env_float("PIPPA_NOTIFY_RETRY_BASE_SECONDS", 30.0)
PIPPA_NOTIFY_RETRY_MAX_SECONDS = env_float("PIPPA_NOTIFY_RETRY_MAX_SECONDS", 3600.0)
# A worker's claim on a message while it sends; a dead worker's runs out.
PIPPA_NOTIFY_CLAIM_SECONDS = env_int("PIPPA_NOTIFY_CLAIM_SECONDS", 120)
# A person's own addresses reach public hosts only, through channels meant for
# people (notifications.safety). The operator may allow more Apprise schemes
# (e.g. "json" for a webhook) and networks that are not public (e.g. a
# household's "192.168.1.0/24"); cloud metadata addresses stay refused.
PIPPA_NOTIFY_ALLOW_SCHEMES = env_list("PIPPA_NOTIFY_ALLOW_SCHEMES")
# A network that cannot be read stops the site at start, not a send later.
PIPPA_NOTIFY_ALLOW_NETWORKS = [
    str(ipaddress.ip_network(net, strict=False))
    for net in env_list("PIPPA_NOTIFY_ALLOW_NETWORKS")
]
# A person's "Send a test message" button: at most one message this often.
PIPPA_NOTIFY_TEST_SECONDS = env_int("PIPPA_NOTIFY_TEST_SECONDS", 30)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
    "loggers": {
        "pippa": {
            "handlers": ["console"],
            "level": env_str("LOG_LEVEL", "INFO"),
            "propagate": False,
        },
    },
}
