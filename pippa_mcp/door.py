"""The MCP door: the one server, who a call acts as, and the guard every tool passes.

``tool`` registers a plain function on ``server`` and returns it wrapped by
``guarded`` (the text rule on its arguments, a refusal as a tool error); the
server runs a synchronous tool on one of the SDK's worker threads with a
fresh database connection (``connected``, ``in_thread``). ``acting_as`` sets
the user a call acts as (the stdio or HTTP door does); ``current_user``
reads it. ``PippaMCPServer`` refuses an argument a tool does not take and
says an argument error in one sentence. The tools themselves live in
``task_tools``, ``step_tools``, ``artifact_tools`` and ``council_tools``;
``pippa_mcp.server`` imports them all.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import anyio
import anyio.to_thread
from django.db import DatabaseError, DataError, close_old_connections, connections
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import (
    ToolError,
    UnexpectedToolError,
)
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.types import (
    ToolAnnotations,
)
from pydantic import BaseModel, ValidationError

from artifacts.store import BlobError
from pippa_site.errors import PippaError
from pippa_site.text import json_check
from tasks import shapes

log = logging.getLogger("pippa.mcp")
SERVER_NAME = "pippa"
ERR_NO_USER = "this MCP server is not signed in as any user"
ERR_BAD_ARGS = "bad arguments for {tool}: {reasons}"
ERR_UNKNOWN_ARGS = (
    "{tool} does not take the {noun} {unknown}; it takes: {accepted}"
    " (check the spelling: an argument it does not know is never ignored)"
)
ERR_DATABASE = "the database is unavailable right now; try the call again shortly"
INSTRUCTIONS = """\
Pippa keeps a task's plan and every step's output in durable storage, keyed by \
conversation, not by your session. After any interruption (a new session, a \
crash, another agent taking over) call resume_context for the task before doing \
anything else: a short document that counts the steps by status, shows the step \
to run next and a few after it (with what resume will do with each), the last \
few finished steps with their output refs and excerpts, and the note you left \
(write_note). Older steps are read page by page with read_steps. Never redo \
finished work.
Outputs are artifacts with a class that decides what resume does:
1 file (reused if the file is still there and intact), 2 fetch (safe to fetch \
again), 3 snapshot (a search, a live quote: never re-run once saved; reuse it), \
4 render (a widget or chart, re-rendered only from intact sources).
run_next_step answers only after the step's result is saved (write before \
show). A step that waits for a decision (a call with outside effects left \
unfinished, a failure) shows its ways forward in decision_choices; take one with \
decide_step. A step whose work you did yourself is recorded with complete_step \
(its output is saved like a tool's). pause_task, resume_task and cancel_task \
stop and start a task. Artifacts travel as refs (id, sha256, class); read one with artifact_read when \
you need its source text or its PNG preview."""


# -- who the call acts as -------------------------------------------------------

_user: ContextVar[Any] = ContextVar("pippa_mcp_user", default=None)


@contextmanager
def acting_as(user) -> Iterator[None]:
    """Run the enclosed MCP handling as ``user`` (set by the stdio or HTTP door)."""
    token = _user.set(user)
    try:
        yield
    finally:
        _user.reset(token)


def current_user():
    user = _user.get()
    if user is None:
        raise ToolError(ERR_NO_USER)
    return user


def actor() -> str:
    """How events name an agent's action through MCP."""
    return f"mcp:{current_user().get_username()}"


# -- the door: one rule for every tool --------------------------------------------


@functools.cache
def _signature(fn: Callable) -> inspect.Signature:
    return inspect.signature(fn)


def _check_arguments(fn: Callable, args: tuple, kwargs: dict) -> None:
    """Apply the text rule to every argument, at any depth (``json_check``).

    NUL and unpaired surrogates are refused anywhere, keys included, and a
    value nested deeper than ``pippa_site.text.MAX_JSON_DEPTH`` is refused as
    a whole.
    """
    bound = _signature(fn).bind_partial(*args, **kwargs)
    for name, value in bound.arguments.items():
        if isinstance(value, Context):
            continue
        if isinstance(value, BaseModel):
            value = value.model_dump()
        elif isinstance(value, list):
            value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
        json_check(value, field=name)


def _plain_error(exc: Exception) -> str | None:
    """The plain sentence for a failure a caller can act on, else None."""
    if isinstance(exc, PippaError):  # NotFound among them
        return str(exc)
    if isinstance(exc, BlobError):
        return "an artifact's payload is missing or damaged in the blob store"
    if isinstance(exc, DataError):
        return "a value is out of range or not storable"
    if isinstance(exc, DatabaseError):
        return ERR_DATABASE
    return None


def _as_tool_error(exc: Exception) -> ToolError | None:
    if isinstance(exc, ToolError):
        return exc
    message = _plain_error(exc)
    return None if message is None else ToolError(message)


def guarded(fn: Callable) -> Callable:
    """Make ``fn`` a door: the text rule on its arguments, refusals as tool errors."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args, **kwargs):
            try:
                _check_arguments(fn, args, kwargs)
                return _as_json(await fn(*args, **kwargs))
            except Exception as exc:
                error = _as_tool_error(exc)
                if error is None:
                    raise
                raise error from None

        return run_async

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            _check_arguments(fn, args, kwargs)
            return _as_json(fn(*args, **kwargs))
        except Exception as exc:
            error = _as_tool_error(exc)
            if error is None:
                raise
            raise error from None

    return run


def _as_json(answer: Any) -> Any:
    """A shape as the JSON a client reads (its wire keys); anything else as it is.

    The SDK validates the answer against the tool's declared shape again
    before it leaves the server, so a direct caller (a test) and a client see
    the same keys and values.
    """
    if isinstance(answer, shapes.Shape):
        return answer.model_dump(mode="json", by_alias=True)
    return answer


def connected(fn: Callable) -> Callable:
    """Run ``fn`` in one of the SDK's worker threads with a fresh connection.

    A worker thread outlives the call, so its connection is closed again
    afterwards.
    """

    @functools.wraps(fn)
    def run(*args, **kwargs):
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return run


async def in_thread(fn: Callable, *args, limiter=None, **kwargs):
    """``fn(*args, **kwargs)`` on a worker thread with a fresh connection: one of
    the tool threads (``PIPPA_MCP_THREADS``), or one that ``limiter`` bounds."""
    return await anyio.to_thread.run_sync(
        functools.partial(connected(fn), *args, **kwargs), limiter=limiter
    )


# -- the server ---------------------------------------------------------------------


class PippaMCPServer(MCPServer):
    """MCPServer whose tools take only the arguments they name, and whose
    argument errors read as one plain sentence.

    Every tool's input schema says ``additionalProperties: false``, and a call
    with an argument the tool does not take is refused with a sentence that
    names it and the ones it takes: a misspelled flag (``queued`` for
    ``queue``) is never silently dropped.
    """

    async def list_tools(self):
        tools = await super().list_tools()
        for listed in tools:
            listed.input_schema = {**listed.input_schema, "additionalProperties": False}
        return tools

    async def call_tool(self, name, arguments, context=None):
        accepted = _ACCEPTS.get(name)
        unknown = [
            key
            for key in arguments or {}
            if accepted is not None and key not in accepted
        ]
        if unknown:
            raise ToolError(_unknown_arguments(name, unknown, accepted))
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(
                    ERR_BAD_ARGS.format(tool=name, reasons=_reasons(cause))
                ) from None
            # The SDK prefixes "Error executing tool <name>: "; the sentence is enough.
            message = str(exc).removeprefix(f"Error executing tool {name}: ")
            raise ToolError(message) from None


def _unknown_arguments(name: str, unknown: list[str], accepted: tuple[str, ...]) -> str:
    named = ", ".join(repr(key[:60]) for key in unknown[:5])
    takes = ", ".join(accepted) if accepted else "no arguments"
    noun = "argument" if len(unknown) == 1 else "arguments"
    return ERR_UNKNOWN_ARGS.format(tool=name, noun=noun, unknown=named, accepted=takes)


def _reasons(error: ValidationError) -> str:
    parts = []
    for err in error.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).rstrip(".")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


server = PippaMCPServer(
    SERVER_NAME,
    title="Pippa Stateful",
    instructions=INSTRUCTIONS,
    version="1",
    # No resources/subscribe and no subscriptions/listen: over stateless HTTP
    # there is no stream a change made by another request or process could
    # reach, so none is advertised (poll get_task instead).
    subscriptions=False,
)
# Pippa has no prompts: a capability is advertised only with content behind it.
for _method in ("prompts/list", "prompts/get"):
    server._lowlevel_server._request_handlers.pop(_method, None)

# The arguments each tool takes, by tool name (its signature, less the Context).
_ACCEPTS: dict[str, tuple[str, ...]] = {}


def tool(
    *,
    title: str | None = None,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
) -> Callable[[Callable], Callable]:
    """Register a plain function as a tool on ``server``; return it as a door.

    ``title`` is what a client shows a person; the four hints say what a call
    does to the world, every one of them spelled out (a client assumes a
    hint left out is the worst case: destructive, open world). A read is
    neither destructive nor anything but idempotent. The function's return
    type is a shape (``pippa_mcp.shapes``): the SDK publishes it as the
    tool's output schema and checks every answer against it.

    The returned function (``guarded``) is what the module exports and what
    tests call; the server runs a synchronous one in a worker thread with its
    own database connection.
    """
    annotations = ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive and not read_only,
        idempotent_hint=idempotent or read_only,
        open_world_hint=open_world,
    )

    def register(fn: Callable) -> Callable:
        door = guarded(fn)
        run = door if inspect.iscoroutinefunction(fn) else connected(door)
        server.add_tool(run, name=fn.__name__, title=title, annotations=annotations)
        context = find_context_parameter(fn)
        _ACCEPTS[fn.__name__] = tuple(
            name for name in _signature(fn).parameters if name != context
        )
        return door

    return register
