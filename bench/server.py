"""The production server for bench modules: gunicorn as ``make run`` starts it."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.peers import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(**extra: str) -> dict[str, str]:
    """The bench's environment for child processes, with manifest static files."""
    env = {k: v for k, v in os.environ.items() if k != "PIPPA_PLAIN_STATIC"}
    env |= {
        "PYTHONPATH": str(REPO),
        "HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "PIPPA_ACCESS_LOG": "",
        "PIPPA_WEB_LOG_LEVEL": "error",
    }
    return env | extra


def collectstatic(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=REPO,
        env=env,
        check=True,
        timeout=300,
    )


@contextmanager
def gunicorn(env: dict[str, str]) -> Iterator[int]:
    """Run gunicorn with pippa_site/gunicorn_conf.py; yield its port once it answers."""
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "-c",
            "python:pippa_site.gunicorn_conf",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port = int(env["PORT"])
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/login/")
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
