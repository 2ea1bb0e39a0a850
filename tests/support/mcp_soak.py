"""Many MCP calls over HTTP, some abandoned mid-way: the load of a soak test.

Run as its own process (``python -m tests.support.mcp_soak URL CALLS
CONCURRENCY TASK_ID TOKEN...``), so its client work does not share the
interpreter lock with the server under test; prints the outcomes as JSON.
Every tenth call leaves once the answer has started (headers read, body not),
another tenth before the answer started; the rest must be answered 200 with
their own id.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import anyio
import httpx2

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}


async def soak(url: str, calls: int, concurrency: int, task_id: int, tokens: list[str]):
    tools = [
        ("get_task", {"task_id": task_id}),
        ("resume_context", {"task_id": task_id}),
        ("list_conversations", {}),
    ]
    outcomes: Counter = Counter()
    numbers = iter(range(calls))

    async def one(client, n: int, headers: dict) -> None:
        name, args = tools[n % len(tools)]
        body = {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {"name": name, "arguments": args},
        }
        if n % 10 == 3:
            async with client.stream("POST", url, json=body, headers=headers):
                outcomes["left mid-answer"] += 1
            return
        if n % 10 == 7:
            with anyio.move_on_after(0.001 * (n % 5)):
                await client.post(url, json=body, headers=headers)
            outcomes["left early"] += 1
            return
        response = await client.post(url, json=body, headers=headers)
        text = response.text.replace(" ", "")
        if (
            response.status_code == 200
            and f'"id":{n}' in text
            and '"isError":false' in text
        ):
            outcomes["answered"] += 1
        else:
            outcomes[f"failed {response.status_code}: {response.text[:200]}"] += 1

    async def worker(raw: str) -> None:
        headers = {**HEADERS, "Authorization": f"Bearer {raw}"}
        limits = httpx2.Limits(max_connections=1)
        async with httpx2.AsyncClient(limits=limits, timeout=30) as client:
            for n in numbers:
                await one(client, n, headers)

    async with anyio.create_task_group() as group:
        for w in range(concurrency):
            group.start_soon(worker, tokens[w % len(tokens)])
    return outcomes


def main(argv: list[str]) -> None:
    url, calls, concurrency, task_id, *tokens = argv
    outcomes = anyio.run(soak, url, int(calls), int(concurrency), int(task_id), tokens)
    print(json.dumps(dict(outcomes)))


if __name__ == "__main__":
    main(sys.argv[1:])
