"""The Model Context Protocol server: tools and resources over Pippa's durable state.

Every tool is a plain module-level function, a thin door onto the services
the JSON API and the dashboard call (``tasks.plan``, ``tasks.actions``,
``tasks.resume``, ``artifacts``, ``council``); none carries a rule of its own.
The package keeps them by what they serve:

- ``pippa_mcp.door``: the one ``server``, who a call acts as (``acting_as``),
  the guard every tool passes (``guarded``: the text rule on its arguments, a
  refusal as a tool error) and ``tool``, which registers a function and
  returns it as a door;
- ``pippa_mcp.arguments`` (the argument types and their limits) and
  ``pippa_mcp.answers`` (pages, cursors and the documents the tools answer);
- the tools: ``task_tools`` (conversations, tasks, plans, notes),
  ``step_tools`` (running, stopping and deciding steps), ``artifact_tools``
  and ``council_tools``;
- ``pippa_mcp.resources``: the ``pippa://`` resources, their listing and
  the completion of their ids;
- ``pippa_mcp.messages``: the answers to requests the SDK cannot read.

This module imports them all, so the server it holds has every tool and
resource registered, and names every tool: a test calls
``get_task(task_id=1)`` inside ``acting_as(user)`` without the protocol and
meets the errors a client would.

The user a call acts as comes from the door that received it (``--user`` or a
token for stdio, the bearer token for HTTP) through ``acting_as``; every read
is owner-only (a staff user's token too), and another user's id is reported
exactly like a missing one.

An anticipated failure (unknown id, a plan that would change history, a lease
held elsewhere, bad arguments, text no database can store) is a tool error
with one plain sentence (``isError``); nothing a caller sends crashes the
server.
"""

from __future__ import annotations

import anyio
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from pippa_mcp.arguments import MAX_PAGE, MAX_STORE_BYTES, PAGE_ROWS
from pippa_mcp.door import PippaMCPServer, acting_as, in_thread, server
from pippa_mcp.messages import invalid_request_id, unreadable_answer

# The order tools/list gives the tools in is the order they are registered in,
# so these modules are imported in the order a client reads them.
# isort: off
from pippa_mcp.task_tools import (
    create_task,
    get_task,
    list_conversations,
    list_step_tools,
    list_tasks,
    read_steps,
    resume_context,
    rewrite_plan,
    write_note,
)
from pippa_mcp.step_tools import (
    MCP_PAUSED,
    cancel_task,
    complete_step,
    decide_step,
    decision_choices,
    pause_task,
    resume_task,
    run_next_step,
)
from pippa_mcp.artifact_tools import artifact_read, artifact_store
from pippa_mcp.council_tools import (
    council_context,
    council_round_conclude,
    council_round_start,
    council_rounds,
    council_turn_add,
)
from pippa_mcp import resources  # noqa: F401  (registers the resources)

# isort: on

__all__ = [
    "MAX_PAGE",
    "MAX_STORE_BYTES",
    "MCP_PAUSED",
    "PAGE_ROWS",
    "acting_as",
    "artifact_read",
    "artifact_store",
    "build_server",
    "cancel_task",
    "complete_step",
    "council_context",
    "council_round_conclude",
    "council_round_start",
    "council_rounds",
    "council_turn_add",
    "create_task",
    "decide_step",
    "decision_choices",
    "get_task",
    "in_thread",
    "invalid_request_id",
    "list_conversations",
    "list_step_tools",
    "list_tasks",
    "pause_task",
    "read_steps",
    "resume_context",
    "resume_task",
    "rewrite_plan",
    "run_next_step",
    "serve_stdio",
    "server",
    "write_note",
]


def build_server() -> PippaMCPServer:
    """Return the MCP server, with every tool and resource registered."""
    return server


async def serve_stdio() -> None:
    """Serve ``server`` over stdin and stdout until stdin closes.

    As ``MCPServer.run("stdio")``, except that a request the SDK cannot
    parse (nested past its limit) gets an error answer instead of none.
    """
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read, write):
        send, receive = create_context_streams[SessionMessage | Exception](0)

        async def forward():
            async with send:
                async for item in read:
                    answer = (
                        unreadable_answer(item) if isinstance(item, Exception) else None
                    )
                    if answer is not None:
                        await write.send(answer)
                        continue
                    await send.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(forward)
            await lowlevel.run(receive, write, lowlevel.create_initialization_options())
            group.cancel_scope.cancel()
