"""MCP fixtures: the SDK's own client over stdio (a subprocess) and over HTTP."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import time
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import Implementation

from api.services import token_create
from tests.conftest import REPO
from tests.support.asgi_server import ThreadedServer

PLAN = [
    {"title": "Fetch closes", "tool": "test.fetch", "args": {}},
    {"title": "Search the news", "tool": "test.snapshot", "args": {}},
    {"title": "Chart", "tool": "test.render", "args": {"source": 2}},
]


@pytest.fixture(autouse=True)
def _test_tools(tool_log):
    """The test tools, in this process and in every server process started."""


@pytest.fixture
def token_for():
    """Make a token for ``user``; each gets a name of its own (names are unique
    among a user's active tokens)."""
    made = itertools.count(1)

    def make(user) -> str:
        return token_create(user=user, name=f"mcp test {next(made)}").raw

    return make


@asynccontextmanager
async def http_session(url: str, token: str, *, name: str = "agent-a"):
    """An initialized ClientSession to ``url`` with a bearer token."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(
            streams[0], streams[1], client_info=Implementation(name=name, version="1")
        ) as session,
    ):
        await session.initialize()
        yield session


@pytest.fixture
def asgi_server(transactional_db):
    """The site's ASGI application under uvicorn, in a thread of this process."""
    server = ThreadedServer().start()
    yield server
    server.stop()


@pytest.fixture
def mcp_url(asgi_server) -> str:
    return f"{asgi_server.url}/mcp/"


@pytest.fixture
def server_env(subprocess_env, tool_log):
    return {
        **subprocess_env,
        "PIPPA_TOOLS": "tests.support.tools",
        "PIPPA_TOOL_LOG": str(tool_log),
    }


@pytest.fixture
def stdio_session(server_env, python_exe):
    """Start ``manage.py pippa_mcp`` with ``args`` and connect the SDK's client."""

    @asynccontextmanager
    async def start(*args: str, name: str = "agent-a", env: dict | None = None):
        params = StdioServerParameters(
            command=python_exe,
            args=["manage.py", "pippa_mcp", *args],
            env={**server_env, **(env or {})},
            cwd=str(REPO),
        )
        async with (
            stdio_client(params) as (read, write),
            ClientSession(
                read, write, client_info=Implementation(name=name, version="1")
            ) as session,
        ):
            await session.initialize()
            yield session

    return start


@pytest.fixture
def http_server(server_env, python_exe, tmp_path):
    """Start uvicorn serving the ASGI application in its own process; yield (url, process)."""
    procs = []

    def start():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with (tmp_path / f"uvicorn-{port}.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    *(python_exe, "-m", "uvicorn", "pippa_site.asgi:application"),
                    *("--host", "127.0.0.1", "--port", str(port)),
                    *("--lifespan", "on", "--http", "h11", "--no-proxy-headers"),
                ],
                cwd=REPO,
                env=server_env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return f"http://127.0.0.1:{port}/mcp/", proc
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.2)
        raise AssertionError("uvicorn did not start")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def data(result):
    """The structured result of a successful tool call."""
    assert not result.is_error, result.content[0].text
    content = result.structured_content
    return content["result"] if set(content) == {"result"} else content


def error(result) -> str:
    """The plain sentence of a failed tool call."""
    assert result.is_error, result.content
    (block,) = result.content
    return block.text


async def call(mcp: ClientSession, tool: str, args: dict) -> Any:
    """Call ``tool`` and return its structured result; the call must succeed."""
    return data(await mcp.call_tool(tool, args))


async def task_create(
    mcp: ClientSession,
    *,
    steps: list[dict] = PLAN,
    title: str = "t",
    conversation_title: str = "c",
) -> dict:
    """Create a task in a new conversation through ``create_task``; return it."""
    return await call(
        mcp,
        "create_task",
        {"title": title, "conversation_title": conversation_title, "steps": steps},
    )


def started_calls(log, step_id: int) -> list[dict]:
    if not log.exists():
        return []
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    return [x for x in lines if x["step"] == step_id and x["phase"] == "start"]
