"""The Model Context Protocol server: tools and resources over Pippa's durable state.

Every tool is a plain module-level function, a thin door onto the services
the JSON API and the dashboard call (``tasks.plan``, ``tasks.actions``,
``tasks.resume``, ``artifacts``, ``council``); none carries a rule of its own.
``tool`` registers each one on the module's ``server`` and returns it
wrapped by ``guarded`` (the text rule on its arguments, a refusal as a tool
error), so a test calls ``get_task(task_id=1)`` inside ``acting_as(user)``
without the protocol and meets the errors a client would.

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

import base64
import binascii
import functools
import inspect
import json
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from django.conf import settings
from django.db import DatabaseError, DataError, close_old_connections, connections
from django.db.models import CharField
from django.db.models.functions import Cast
from django.template.defaultfilters import filesizeformat
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import (
    ResourceNotFoundError,
    ToolError,
    UnexpectedToolError,
)
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    INVALID_PARAMS,
    PARSE_ERROR,
    CallToolResult,
    Completion,
    ErrorData,
    ImageContent,
    JSONRPCError,
    ListResourcesResult,
    PaginatedRequestParams,
    Resource,
    ResourceTemplateReference,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifacts.models import Artifact, ArtifactClass
from artifacts.preview import preview_artifact_for, preview_status
from artifacts.selectors import artifact_text_head
from artifacts.services import MAX_SOURCES
from artifacts.store import BlobError, default_store
from council.models import TurnArtifact
from council.selectors import (
    context_for,
    participant_get,
    round_get_for_user,
    round_payload,
    rounds_of,
)
from council.services import participant_ref, round_conclude
from council.services import round_start as council_round_create
from council.services import turn_add as council_turn_create
from council.shapes import CouncilContext, RoundOut
from pippa_mcp.shapes import (
    ArtifactReadOut,
    Choice,
    CompletedStep,
    ConversationItem,
    ConversationPage,
    DecideAnswer,
    DecisionOut,
    DecisionPage,
    PreviewRef,
    RoundPage,
    StepRunAnswer,
    StepState,
    StepToolOut,
    StepToolPage,
    StoredArtifact,
    TaskActionAnswer,
    TaskBrief,
    TaskDoc,
    TaskPage,
    TaskWithUsage,
    TurnAdded,
)
from pippa_site.errors import PippaError
from pippa_site.slots import STEP_RUNS
from pippa_site.text import json_check, media_type_check
from tasks import actions, shapes
from tasks.documents import (
    artifact_get,
    artifact_payload,
    artifacts_get,
    conversation_get_for_user,
    conversation_payload,
    step_complete_payload,
    step_payload,
    task_get_for_user,
    task_payload,
    task_summary,
)
from tasks.lease import door_worker_id, lease_release_own
from tasks.models import Brain, Conversation, Step, Task
from tasks.plan import conversation_task_create, plan_rewrite
from tasks.plan import task_create as plan_task_create
from tasks.resume_document import (
    MAX_PAGE_STEPS,
    PAGE_STEPS,
    note_document,
    resume_document,
    steps_read,
)
from tasks.services import NOTE_MAX_CHARS, task_artifact_upload, task_note_write
from tasks.shapes import (
    MediaType,
    ResumeNoteOut,
    ResumeOut,
    StepCount,
    StepPageOut,
    Title,
    TitleOrEmpty,
    ToolName,
)
from tasks.tools import tools_all
from tasks.usage import task_token_usage
from tasks.words import CHOICES

log = logging.getLogger("pippa.mcp")

SERVER_NAME = "pippa"
MAX_STORE_BYTES = 1024 * 1024
MAX_SOURCE_CHARS = 256 * 1024
EXCERPT_BYTES = 600
# Rows a page of a list holds unless the caller asks for fewer (at most MAX_PAGE).
PAGE_ROWS = 50
MAX_PAGE = 200
# Ids a completion offers at most (the protocol's own limit).
MAX_COMPLETIONS = 100
# Seconds between "still running" progress notifications of a long step.
PROGRESS_INTERVAL = 1.0

ERR_NO_USER = "this MCP server is not signed in as any user"
ERR_BAD_ARGS = "bad arguments for {tool}: {reasons}"
ERR_UNKNOWN_ARGS = (
    "{tool} does not take the {noun} {unknown}; it takes: {accepted}"
    " (check the spelling: an argument it does not know is never ignored)"
)
ERR_DATABASE = "the database is unavailable right now; try the call again shortly"
ERR_CONVERSATION_CHOICE = (
    "give either conversation_id (an existing conversation) or conversation_title"
    " (a new one), not both and not neither"
)
ERR_SHA_MISMATCH = "artifact {id} has sha256 {actual}, not {expected}: the ref you hold names other bytes"
ERR_BLOB_MISSING = "artifact {id} has lost its payload (the blob is missing)"
ERR_BINARY = (
    "artifact {id} is {media_type}, which is not text: ask for view='preview' if it"
    " is a widget, or download it over the JSON API"
)
ERR_NO_PREVIEW = "artifact {id} has no PNG preview{reason}"
ERR_EMPTY = "content is empty: send the artifact's text (or base64 bytes)"
ERR_TOO_LARGE = (
    "content is {size:,} bytes, more than the {limit:,} this tool takes; upload a"
    " payload that big over the JSON API (POST /api/v1/tasks/{id}/artifacts, with"
    " an API token from /settings/tokens/: it streams up to {upload_limit})"
)
ERR_BASE64 = "content is not valid base64 (encoding='base64')"
ERR_NO_WIDGET_OR_TEXT = "a turn needs text or a widget"
ERR_REQUEST_ID = (
    "Invalid Request: a request's id must be a string or an integer (not null),"
    " not {id}"
)
ERR_UNREADABLE = (
    "the message could not be read ({reason}); if its arguments are deeply"
    " nested, send flatter JSON"
)
ERR_NO_STEP = "step {step} is not a step of task {task}"
ERR_CURSOR = (
    "cursor {cursor!r} is not one {listing} gave out; leave it out to start"
    " from the first page"
)
ERR_CONFIRM = "{reason} Call decide_step again with confirm=true."
# What run_next_step says when nothing ran, naming the tool that goes on.
MCP_PAUSED = "the task is paused; call resume_task to queue it, then run_next_step"
MCP_DECISION = (
    "step {position} is {status}: it waits for a decision; call decision_choices"
    " for the ways forward, then decide_step"
)
ALREADY_STORED = (
    "these bytes were already stored as artifact {id} (class {artifact_class},"
    " {media_type}, “{title}”): that row is kept as it is, and only this task's"
    " link and any new source_refs were added"
)
MSG_PAUSED = "paused “{title}”: it stops after the step it is on"
MSG_QUEUED = "queued “{title}”: call run_next_step, or let a worker take it"
MSG_CANCELLED = (
    "cancelled “{title}”: no further step starts; the steps and outputs stay"
)
MSG_DECIDED = "step {position}: {label}"

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


def _actor() -> str:
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


def _connected(fn: Callable) -> Callable:
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
        functools.partial(_connected(fn), *args, **kwargs), limiter=limiter
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


def build_server() -> PippaMCPServer:
    """Return the MCP server, with every tool and resource registered."""
    return server


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
        run = door if inspect.iscoroutinefunction(fn) else _connected(door)
        server.add_tool(run, name=fn.__name__, title=title, annotations=annotations)
        context = find_context_parameter(fn)
        _ACCEPTS[fn.__name__] = tuple(
            name for name in _signature(fn).parameters if name != context
        )
        return door

    return register


# -- stdio ------------------------------------------------------------------------------


def _request_id(line: str) -> int | str | None:
    """The id of the request on ``line`` when Python's own parser can read it."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(message, dict) and "method" in message:
        found = message.get("id")
        if isinstance(found, str) or (
            isinstance(found, int) and not isinstance(found, bool)
        ):
            return found
    return None


def invalid_request_id(body: bytes) -> str | None:
    """Why a request in ``body`` has an id JSON-RPC does not allow, or None.

    MCP's ids are strings or integers, never null; a request whose id is
    null, a fraction or NaN would otherwise be taken for a notification (the
    SDK parses it so) and dropped without an answer. The door answers it
    with JSON-RPC's Invalid Request error and a null id instead.
    """
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the SDK answers the parse error
    messages = message if isinstance(message, list) else [message]
    for item in messages:
        if not isinstance(item, dict) or "method" not in item or "id" not in item:
            continue
        found = item["id"]
        if isinstance(found, str) or (
            isinstance(found, int) and not isinstance(found, bool)
        ):
            continue
        if isinstance(found, float) and math.isfinite(found) and found.is_integer():
            continue  # 7.0 is the integer 7, as the SDK reads it
        return ERR_REQUEST_ID.format(id=json.dumps(found)[:40])
    return None


def unreadable_answer(exc: Exception) -> SessionMessage | None:
    """The error answer to a line the SDK could not parse, or None.

    The SDK's stdio reader passes such a line on as an exception, which the
    session drops: the client would wait for ever. Its parser stops at 200
    levels of nesting where Python's reads on, so the request's id can still
    be found and answered (JSON-RPC's parse error, with that id).
    """
    if not isinstance(exc, ValidationError):
        return None
    errors = exc.errors()
    if not errors or errors[0].get("type") != "json_invalid":
        return None
    line = errors[0].get("input")
    request_id = _request_id(line) if isinstance(line, str) else None
    if request_id is None:
        return None
    reason = str(errors[0].get("msg", "invalid JSON")).removeprefix("Invalid JSON: ")
    return SessionMessage(
        JSONRPCError(
            jsonrpc="2.0",
            id=request_id,
            error=ErrorData(
                code=PARSE_ERROR, message=ERR_UNREADABLE.format(reason=reason)
            ),
        )
    )


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


# -- argument types -------------------------------------------------------------------

# Strict: JSON true is not task 1, and "5" is not 5.
Id = Annotated[int, Field(strict=True, ge=1, le=2**63 - 1)]
Position = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]
# The name a calling agent gives itself; a lease is held under it.
Worker = Annotated[
    str,
    Field(
        max_length=60,
        description="your own name, e.g. claude-laptop; the lease is held under it",
    ),
]
Flag = Annotated[bool, Field(strict=True)]
Limit = Annotated[
    int,
    Field(strict=True, ge=1, le=MAX_PAGE, description=f"rows a page, 1 to {MAX_PAGE}"),
]
Cursor = Annotated[
    str | None,
    Field(
        max_length=200,
        description="next_cursor of the page before; leave it out for the first page",
    ),
]
ArtifactClassValue = Annotated[shapes.ArtifactClassValue, Field(strict=True)]
# The statuses are Step.Status's, written out for the tool's JSON schema.
StepStatus = Literal[tuple(Step.Status.values)]
# The ways forward are tasks.words.CHOICES's (what the dashboard offers too).
DecisionAction = Literal[tuple(CHOICES)]


class StepIn(BaseModel):
    """One step of a new plan."""

    model_config = ConfigDict(extra="forbid", strict=True)

    title: Title
    tool: Annotated[ToolName, Field(description="a name from list_step_tools")]
    args: dict[str, Any] = Field(
        default_factory=dict, description="small JSON arguments; refs, never payloads"
    )


class PlanItem(BaseModel):
    """One entry of the whole plan, like a todo list item."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: Id | None = Field(
        default=None, description="an existing step's id: keeps that step"
    )
    title: TitleOrEmpty | None = None
    tool: Annotated[str | None, Field(max_length=shapes.TOOL_NAME_MAX)] = None
    args: dict[str, Any] | None = None
    status: StepStatus | None = Field(
        default=None,
        description="the status you believe it has; a different stored status is refused",
    )


class Participant(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=100)]
    brain: str = Field(
        default="other",
        max_length=40,
        description="claude, codex, kimi, grok, glm, gemini, ollama or other",
    )


def _models(items: list, model: type[BaseModel]) -> list:
    """``items`` as ``model`` instances: the SDK passes models, a direct caller dicts."""
    return [i if isinstance(i, model) else model.model_validate(i) for i in items]


# -- pages ----------------------------------------------------------------------------


def _cursor_read(cursor: str | None, listing: str) -> Any:
    """The key a page starts after, from a cursor this listing gave out; else a refusal."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        kind, after = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        kind, after = None, None
    if kind != listing or isinstance(after, bool) or not isinstance(after, int | str):
        raise ToolError(ERR_CURSOR.format(cursor=cursor[:40], listing=listing))
    return after


def _cursor(listing: str, after: int | str) -> str:
    raw = json.dumps([listing, after]).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _page_of(rows, limit: int) -> tuple[list, bool]:
    """The first ``limit`` rows, and whether there are more (one row is read past)."""
    taken = list(rows[: limit + 1])
    return taken[:limit], len(taken) > limit


def _page_message(count: int, *, more: bool, first: bool, noun: str, empty: str) -> str:
    """What a page holds, in a sentence a model reads even when it is empty."""
    if not count:
        return empty if first else f"No more {noun}: the page before was the last."
    words = f"{count} {noun}"
    return (
        f"{words}; more on the next page (pass next_cursor)." if more else f"{words}."
    )


# -- documents ------------------------------------------------------------------------


def _uri(kind: str, pk: int) -> str:
    return f"pippa://{kind}/{pk}"


def _plain_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _task_doc(task: Task) -> dict[str, Any]:
    """The task document (``TaskDoc``): the plan, each output ref with its uri."""
    doc = task_payload(task)
    doc["uri"] = _uri("task", task.pk)
    for step in doc["steps"]:
        if step["output"]:
            step["output"]["uri"] = _uri("artifact", step["output"]["id"])
    return _plain_json(doc)


def _task_brief(task: Task, *, refresh: bool = True) -> TaskBrief:
    """A task without its steps (``task_summary``, the one shape), with its uri."""
    if refresh:
        task.refresh_from_db()
    return TaskBrief(**task_summary(task), uri=_uri("task", task.pk))


def _artifact_doc(artifact) -> dict[str, Any]:
    doc = _plain_json(artifact_payload(artifact))
    doc["uri"] = _uri("artifact", artifact.pk)
    return doc


def _conversation_doc(conversation: Conversation) -> ConversationItem:
    return ConversationItem(
        **conversation_payload(conversation), uri=_uri("conversation", conversation.pk)
    )


def _excerpt(artifact) -> dict[str, Any]:
    head = artifact_text_head(artifact=artifact, limit=EXCERPT_BYTES)
    if head.missing:
        return {"excerpt": None, "note": "the payload is missing"}
    if not head.is_text:
        return {"excerpt": None, "note": f"{artifact.media_type}: not text"}
    return {"excerpt": head.text, "truncated": head.truncated}


def _content_bytes(content: str, encoding: str) -> bytes:
    """The bytes an agent sent as text, or as base64 with encoding='base64'."""
    if encoding != "base64":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError(ERR_BASE64) from None


def _step_get(task: Task, step_id: int) -> Step:
    step = Step.objects.select_related("task").filter(pk=step_id, task=task).first()
    if step is None:
        raise ToolError(ERR_NO_STEP.format(step=step_id, task=task.pk))
    return step


# -- conversations and tasks ------------------------------------------------------


@tool(title="List your conversations", read_only=True)
def list_conversations(
    cursor: Cursor = None, limit: Limit = PAGE_ROWS
) -> ConversationPage:
    """List your conversations, newest first, with the ids of their tasks.

    A conversation holds tasks and council rounds; a task's plan lives here,
    keyed by conversation, so it survives your session ending. At most
    limit a page; pass next_cursor as cursor for the next page.
    """
    after = _cursor_read(cursor, "list_conversations")
    rows = Conversation.objects.for_user(current_user()).order_by("-id")
    if after is not None:
        rows = rows.filter(id__lt=after)
    page, more = _page_of(rows, limit)
    return ConversationPage(
        conversations=[_conversation_doc(c) for c in page],
        next_cursor=_cursor("list_conversations", page[-1].pk) if more else None,
        message=_page_message(
            len(page),
            more=more,
            first=after is None,
            noun="conversations, newest first",
            empty="You have no conversations yet: create_task with a"
            " conversation_title starts one.",
        ),
    )


@tool(title="List a conversation's tasks", read_only=True)
def list_tasks(
    conversation_id: Id, cursor: Cursor = None, limit: Limit = PAGE_ROWS
) -> TaskPage:
    """List the tasks of one conversation, oldest first, with status and progress.

    No steps: call get_task for a task's plan, or resume_context before
    continuing it. At most limit a page; pass next_cursor as cursor for the
    next page.
    """
    after = _cursor_read(cursor, "list_tasks")
    conversation = conversation_get_for_user(
        user=current_user(), conversation_id=conversation_id
    )
    rows = conversation.tasks.order_by("id")
    if after is not None:
        rows = rows.filter(id__gt=after)
    page, more = _page_of(rows, limit)
    return TaskPage(
        tasks=[_task_brief(t, refresh=False) for t in page],
        next_cursor=_cursor("list_tasks", page[-1].pk) if more else None,
        message=_page_message(
            len(page),
            more=more,
            first=after is None,
            noun="tasks, oldest first",
            empty=f"Conversation {conversation.pk} has no tasks yet: create_task"
            f" with conversation_id={conversation.pk} adds one.",
        ),
    )


@tool(title="List the tools a step may run", read_only=True)
def list_step_tools(cursor: Cursor = None, limit: Limit = PAGE_ROWS) -> StepToolPage:
    """List the tools a plan's steps may run: class, arguments, side effects.

    The class decides what resume does with the step's output: 1 file
    (reuse if intact), 2 fetch (fetch again), 3 snapshot (never re-run once
    saved), 4 render (re-render only from intact sources). A tool with
    side_effects is never re-run from an uncertain state; a person decides.
    args_schema is the JSON schema of a step's args for that tool (e.g.
    demo.chart's source: the position of the step whose output it draws).
    """
    after = _cursor_read(cursor, "list_step_tools")
    rows = sorted(tools_all(), key=lambda t: t.name)
    if after is not None:
        rows = [t for t in rows if t.name > after]
    page, more = _page_of(rows, limit)
    return StepToolPage(
        tools=[
            StepToolOut(
                name=t.name,
                artifact_class=t.artifact_class,
                side_effects=t.side_effects,
                media_type=t.media_type,
                description=(t.description or "").strip()[:500],
                args_schema=t.args_schema,
            )
            for t in page
        ],
        next_cursor=_cursor("list_step_tools", page[-1].name) if more else None,
        message=_page_message(
            len(page),
            more=more,
            first=after is None,
            noun="step tools, by name",
            empty="No step tools are registered (PIPPA_TOOLS names the modules"
            " that register them).",
        ),
    )


@tool(title="Create a task with its plan")
def create_task(
    title: Title,
    steps: Annotated[list[StepIn], StepCount],
    conversation_id: Id | None = None,
    conversation_title: TitleOrEmpty | None = None,
    brain: str = "other",
    queue: Flag = True,
) -> TaskDoc:
    """Create a task with its plan (an ordered list of steps) in a conversation.

    Give conversation_id to add it to an existing conversation, or
    conversation_title to start a new one. Each step names a tool from
    list_step_tools; its artifact class is fixed now, so the resume rule of
    every step is known before anything runs. queue=true (the default)
    queues it: run_next_step runs its next step for you, and a background
    worker may take it too. queue=false creates it paused: nothing runs it,
    run_next_step included, until you call resume_task.
    Returns the task with its plan (get_task shape).
    """
    user = current_user()
    if (conversation_id is None) == (not conversation_title):
        raise ToolError(ERR_CONVERSATION_CHOICE)
    if brain not in Brain.values:
        raise ToolError(
            f"brain must be one of {', '.join(Brain.values)}, not {brain!r}"
        )
    new = {
        "title": title,
        "steps": [s.model_dump() for s in _models(steps, StepIn)],
        "brain": brain,
        "queue": queue,
    }
    if conversation_id is not None:
        conversation = conversation_get_for_user(
            user=user, conversation_id=conversation_id
        )
        task = plan_task_create(conversation=conversation, **new)
    else:
        task = conversation_task_create(
            owner=user, conversation_title=conversation_title, **new
        )
    return _task_doc(task)


@tool(title="Read a task and its plan", read_only=True)
def get_task(task_id: Id) -> TaskWithUsage:
    """Return a task and its plan: each step's status, tool, attempts and output ref.

    A step's output is a ref (id, sha256, artifact_class, media_type, uri),
    never the payload; read one with artifact_read. artifact_class is the
    resume rule: 1 file, 2 fetch, 3 snapshot (never re-run), 4 render.
    ``usage`` is the brain turns recorded on the task and the tokens they
    used (input, output, total).
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    # The tokens its brains used, from the task's counters (tasks.usage).
    return {**_task_doc(task), "usage": task_token_usage(task=task).as_data()}


@tool(title="Rewrite a task's plan", destructive=True, idempotent=True)
def rewrite_plan(
    task_id: Id,
    steps: Annotated[list[PlanItem], StepCount],
) -> TaskDoc:
    """Replace the task's whole plan, the way you rewrite a todo list.

    List every step in order. Keep an existing step by giving its id (and
    optionally the status you believe it has); add a step by giving title
    and tool without an id; drop a never-run step by leaving it out. Done
    steps must stay first, unchanged, in their order: their outputs stand.
    A rewrite that would change history (edit or drop a done or attempted
    step, or claim a status the step does not have) is refused with the
    reason, and nothing changes; so is a rewrite while a step is running.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    items = [s.model_dump(exclude_none=True) for s in _models(steps, PlanItem)]
    return _task_doc(plan_rewrite(task=task, steps=items))


@tool(title="Read what to do next on a task", read_only=True)
def resume_context(task_id: Id) -> ResumeOut:
    """Return the resume context: what a resumed brain reads before continuing.

    Read it first whenever you pick up a task you did not just create (new
    session, another agent, after a crash). A bounded document (pippa.resume/3,
    at most 4,000 characters whatever the plan's length): the steps counted
    by status, the step to run next and a few after it with the rule resume
    will apply to each, the last few finished steps with their output refs
    and a short excerpt, and your note (write_note). earlier_done and later
    count the steps it does not list: read them with read_steps.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    return resume_document(task)


@tool(title="Read a task's steps page by page", read_only=True)
def read_steps(
    task_id: Id,
    from_position: Position = 1,
    to_position: Position | None = None,
    status: StepStatus | None = None,
    limit: Annotated[int, Field(strict=True, ge=1, le=MAX_PAGE_STEPS)] = PAGE_STEPS,
) -> StepPageOut:
    """Read a task's steps page by page, in plan order (get_task's step shape).

    Give a range of positions (from_position, to_position), or a status
    (e.g. done, or needs_review) to list only those; at most limit steps
    a page. next_from_position is where the next page starts (null: no
    more); matching counts every step the filter selects. Each step carries
    its output's ref (id, sha256, class), never the payload.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    page = steps_read(
        task=task,
        from_position=from_position,
        to_position=to_position,
        status=status,
        limit=limit,
    )
    return page


@tool(title="Leave yourself a note on a task", idempotent=True)
def write_note(
    task_id: Id,
    text: Annotated[str, Field(min_length=1, max_length=NOTE_MAX_CHARS)],
) -> ResumeNoteOut:
    """Leave yourself a short note on the task, for every later turn and session.

    What you must remember between turns (a decision, what to check next,
    refs you will need) belongs here, not in your chat: resume_context shows
    the last note written, so a session that starts over has it too. Saved
    as an artifact of the task (class 3, a snapshot) before this answers;
    a new note replaces the old one in resume_context. At most
    1,000 characters: refs, not payloads.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    task_note_write(task=task, text=text, actor=_actor())
    return note_document(task)


# -- running, stopping and deciding -----------------------------------------------


def _worker(worker: str) -> str:
    return door_worker_id(door="mcp", user=current_user(), worker=worker or "agent")


async def _with_heartbeats(ctx, fn, done: float, total: float, label: str):
    """Run ``fn`` in a worker thread, reporting progress every few seconds.

    Progress must grow: while the step runs it creeps towards the next whole
    step. An exception from ``fn`` is raised here.
    """
    result: dict[str, Any] = {}
    finished = anyio.Event()

    async def work():
        try:
            # A thread of its own, not one of the tool threads every user's
            # calls share; pippa_site.slots.STEP_RUNS bounds how many run.
            result["run"] = await in_thread(fn, limiter=anyio.CapacityLimiter(1))
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc
        finally:
            finished.set()

    started = time.monotonic()
    beats = 0
    async with anyio.create_task_group() as group:
        group.start_soon(work)
        while not finished.is_set():
            with anyio.move_on_after(PROGRESS_INTERVAL):
                await finished.wait()
            if not finished.is_set() and ctx is not None:
                beats += 1
                await ctx.report_progress(
                    done + 1 - 1 / (beats + 1),
                    total,
                    f"{label} (still running, {time.monotonic() - started:.0f}s)",
                )
    if "error" in result:
        raise result["error"]
    return result["run"]


def _step_run_answer(task: Task, run: actions.StepRun) -> StepRunAnswer:
    """What run_next_step answers: the run, the step and its output ref, the task."""
    task.refresh_from_db()
    detail = run.detail
    if run.waiting == "paused":
        detail = MCP_PAUSED
    elif run.waiting == "decision" and run.step is not None:
        detail = MCP_DECISION.format(
            position=run.step.position, status=run.step.get_status_display()
        )
    ran = None
    step = run.step
    if step is not None:
        ran = _plain_json(step_payload(step))
        if step.output is not None:
            ran["output"].update(
                uri=_uri("artifact", step.output.pk), **_excerpt(step.output)
            )
    return StepRunAnswer(
        ran=run.ran,
        detail=detail,
        rule=run.rule,
        step=ran,
        task=_task_brief(task, refresh=False),
    )


@tool(title="Run the task's next step", open_world=True)
async def run_next_step(
    task_id: Id,
    ctx: Context | None = None,
    worker: Worker = "",
) -> StepRunAnswer:
    """Run the task's next unfinished step and answer once its result is saved.

    The executor takes the task's lease, calls the step's tool, writes the
    output to durable storage and only then answers (write before show):
    you get the step's status, its output ref (id, sha256, class) and a
    short excerpt. A step left uncertain by a crash is resolved by its
    class instead of being blindly re-run. Call again for the next step
    until the task is done, failed or needs review. A paused task runs
    nothing until resume_task; a step that waits for a decision is answered
    with ran=false: see decision_choices and decide_step. Sends progress
    notifications while a long step runs. If another worker holds the
    lease you get an error saying until when.
    """
    user = current_user()
    # One lease per call, given back when the call ends: an agent may never
    # call again, and a second call under the same name must not mistake
    # this one's step for an abandoned one.
    worker_id = f"{_worker(worker)}#{secrets.token_hex(3)}"

    def prepare():
        task = task_get_for_user(user=user, task_id=task_id)
        upcoming = task.steps.not_done().order_by("position").first()
        return task, upcoming

    task, upcoming = await in_thread(prepare)
    total = max(task.steps_total, 1)
    done = task.steps_done
    label = (
        f"running step {upcoming.position} of {task.steps_total}: {upcoming.title}"
        if upcoming is not None
        else "settling the task"
    )
    if ctx is not None:
        await ctx.report_progress(done, total, label)

    def step_and_release():
        try:
            return actions.step_run(task=task, worker_id=worker_id)
        finally:
            try:
                lease_release_own(task=task, worker_id=worker_id)
            except DatabaseError:
                log.warning("lease of task %s left to expire", task.pk)

    # At most PIPPA_STEP_RUNS_PER_USER of this user's step runs at once in this
    # process (a refusal says so), PIPPA_STEP_RUNS for everyone.
    with STEP_RUNS.hold(user.pk):
        run = await _with_heartbeats(ctx, step_and_release, done, total, label)
    if run.lease_busy:
        raise ToolError(run.detail)

    out = await in_thread(_step_run_answer, task, run)
    # Progress only ever grows, so a call that ran nothing sends no second one.
    if ctx is not None and out.task.steps_done > done:
        await ctx.report_progress(
            out.task.steps_done, max(out.task.steps_total, 1), run.detail
        )
    return out


@tool(title="Record a step you did yourself", idempotent=True)
def complete_step(
    task_id: Id,
    step_id: Id,
    content: Annotated[str, Field(min_length=1, max_length=2 * MAX_STORE_BYTES)],
    media_type: MediaType = "text/plain",
    title: TitleOrEmpty = "",
    source_refs: Annotated[list[Id], Field(max_length=MAX_SOURCES)] = [],  # noqa: B006
    encoding: Literal["text", "base64"] = "text",
    worker: Worker = "",
) -> CompletedStep:
    """Record a step whose work you did yourself: name the step, give its output.

    The output (up to 1 MiB: text, or base64 with encoding='base64') is saved
    exactly like a tool's output: written to durable storage before the step
    is marked done, as an artifact of the step's class, so resume treats it
    by that class's rule. Sending the same bytes again is harmless (the
    answer says already=true); a finished step, a step that waits for a
    decision, or a task another worker holds is refused. The task must be
    queued or running (resume_task first if it is paused). source_refs
    names artifacts the output was made from (lineage). Answers with the
    step, its output ref and the task's progress.
    """
    user = current_user()
    task = task_get_for_user(user=user, task_id=task_id)
    _step_get(task, step_id)
    data = _content_bytes(content, encoding)
    sources = artifacts_get(user=user, artifact_ids=source_refs)
    completion = actions.step_complete(
        task=task,
        step_id=step_id,
        data=data,
        media_type=media_type,
        title=title,
        source_ids=[s.pk for s in sources],
        worker_id=f"{_worker(worker)}#{secrets.token_hex(3)}",
    )
    out = step_complete_payload(completion, task)
    out["task"]["uri"] = _uri("task", task.pk)
    if out["step"]["output"]:
        out["step"]["output"]["uri"] = _uri("artifact", out["step"]["output"]["id"])
    return out


@tool(title="Pause a task", idempotent=True)
def pause_task(task_id: Id) -> TaskActionAnswer:
    """Pause a queued or running task: it stops after the step it is on.

    Nothing runs it (run_next_step included) until resume_task. The same
    action as the dashboard's Pause button.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    actions.task_pause(task=task, actor=_actor())
    return TaskActionAnswer(
        message=MSG_PAUSED.format(title=task.title), task=_task_brief(task)
    )


@tool(title="Resume a task", idempotent=True)
def resume_task(task_id: Id) -> TaskActionAnswer:
    """Queue a paused or interrupted task again (the dashboard's Resume).

    Refused while a step waits for a decision (see decision_choices) and for
    a done or cancelled task. Then call run_next_step, or let a worker take it.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    actions.task_resume(task=task, actor=_actor())
    return TaskActionAnswer(
        message=MSG_QUEUED.format(title=task.title), task=_task_brief(task)
    )


@tool(title="Cancel a task for good", destructive=True, idempotent=True)
def cancel_task(task_id: Id) -> TaskActionAnswer:
    """Cancel an unfinished task for good (the dashboard's Cancel).

    A step running now finishes and its output is saved; no further step
    starts. Nothing is deleted. A cancelled task cannot be resumed.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    actions.task_cancel(task=task, actor=_actor())
    return TaskActionAnswer(
        message=MSG_CANCELLED.format(title=task.title), task=_task_brief(task)
    )


def _decision_doc(decision: actions.Decision) -> DecisionOut:
    step = decision.step
    return DecisionOut(
        step_id=step.pk,
        position=step.position,
        title=step.title,
        tool=step.tool,
        status=step.status,
        side_effects=step.side_effects,
        what_happened=decision.advice.words,
        rule=decision.advice.rule,
        plain_words=decision.plain_words,
        choices=[
            Choice(
                action=c.action,
                label=c.label,
                words=c.words,
                recommended=c.recommended,
                needs_confirm=c.confirm,
                warning=c.warning,
            )
            for c in decision.choices
        ],
    )


@tool(title="List the decisions a task waits for", read_only=True)
def decision_choices(
    task_id: Id, cursor: Cursor = None, limit: Limit = PAGE_ROWS
) -> DecisionPage:
    """List the steps that wait for a decision, each with its ways forward.

    The same choices, in the same words, as the dashboard's decision card:
    adopt (use the saved output), rerun (run the same call again), retry
    (start the step over), skip, fail. The recommended one comes first. A
    choice with needs_confirm reaches outside Pippa again: read its warning,
    and pass confirm=true to decide_step only when you mean it. An empty
    list (the message says so) means nothing waits for you.
    """
    after = _cursor_read(cursor, "decision_choices")
    task = task_get_for_user(user=current_user(), task_id=task_id)
    steps = Step.objects.filter(task=task, status__in=actions.ATTENTION_STEPS)
    if after is not None:
        steps = steps.filter(position__gt=after)
    decisions: list[tuple[int, DecisionOut]] = []
    more = False
    for step in steps.order_by("position"):
        step.task = task
        decision = actions.step_decision(step=step, task=task)
        if decision is None:
            continue
        if len(decisions) == limit:
            more = True
            break
        decisions.append((step.position, _decision_doc(decision)))
    return DecisionPage(
        decisions=[d for _, d in decisions],
        next_cursor=_cursor("decision_choices", decisions[-1][0]) if more else None,
        message=_page_message(
            len(decisions),
            more=more,
            first=after is None,
            noun="steps wait for a decision",
            empty=f"No step of task {task.pk} waits for a decision"
            f" (the task is {task.get_status_display()}).",
        ),
    )


@tool(title="Decide a step that waits", destructive=True)
def decide_step(
    task_id: Id,
    step_id: Id,
    action: DecisionAction,
    confirm: Flag = False,
) -> DecideAnswer:
    """Take one of decision_choices' ways forward for a step that waits for a decision.

    Only a choice decision_choices offers now is accepted. One that reaches
    outside Pippa again (needs_confirm) is refused without confirm=true, as
    the dashboard asks for confirmation. The decision is also the go-ahead:
    the task is queued again (unless it leaves it failed or finished); call
    run_next_step to go on.
    """
    task = task_get_for_user(user=current_user(), task_id=task_id)
    step = _step_get(task, step_id)
    try:
        actions.step_decide(step=step, action=action, confirmed=confirm, actor=_actor())
    except actions.ConfirmationNeeded as exc:
        raise ToolError(ERR_CONFIRM.format(reason=str(exc))) from None
    step.refresh_from_db()
    label = CHOICES[action][0]
    return DecideAnswer(
        message=MSG_DECIDED.format(position=step.position, label=label),
        step=StepState(id=step.pk, position=step.position, status=step.status),
        task=_task_brief(task),
    )


# -- artifacts -----------------------------------------------------------------------


@tool(title="Read an artifact", read_only=True)
def artifact_read(
    artifact_id: Id,
    view: Literal["auto", "source", "preview"] = "auto",
    sha256: Annotated[str, Field(max_length=64)] = "",
) -> Annotated[CallToolResult, ArtifactReadOut]:
    """Read an artifact by its ref: its source as text, or its PNG preview as an image.

    view='source' gives an SVG widget's markup or a text payload (capped at
    256 KiB); view='preview' gives the widget's rendered PNG as image content,
    to look at instead of parsing markup; 'auto' picks source for text and
    the image for PNGs. Pass the sha256 from the ref to make sure you read
    the bytes it names. Reading is read-only: no lease, no state change.
    The first content block is the artifact's metadata as JSON (the
    structured answer); the second is the text or the image.
    """
    artifact = artifact_get(user=current_user(), artifact_id=artifact_id)
    if sha256 and sha256.lower() != artifact.sha256:
        raise ToolError(
            ERR_SHA_MISMATCH.format(
                id=artifact.pk, actual=artifact.sha256, expected=sha256
            )
        )
    meta = _artifact_doc(artifact)
    is_png = artifact.media_type == "image/png"
    if view == "auto":
        view = "preview" if is_png else "source"
    if view == "preview":
        image = preview_artifact_for(artifact)
        if image is None:
            why = preview_status(artifact).get("reason") or ""
            raise ToolError(
                ERR_NO_PREVIEW.format(id=artifact.pk, reason=f" ({why})" if why else "")
            )
        try:
            png = default_store().get(image.sha256)
        except BlobError:
            raise ToolError(ERR_BLOB_MISSING.format(id=image.pk)) from None
        read = ArtifactReadOut(
            artifact=meta,
            view="preview",
            preview=PreviewRef(id=image.pk, sha256=image.sha256),
        )
        return _read_answer(
            read,
            ImageContent(
                type="image",
                data=base64.b64encode(png).decode("ascii"),
                mime_type="image/png",
            ),
        )
    head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_CHARS)
    if not head.is_text:
        raise ToolError(
            ERR_BINARY.format(id=artifact.pk, media_type=artifact.media_type)
        )
    if head.missing:
        raise ToolError(ERR_BLOB_MISSING.format(id=artifact.pk))
    read = ArtifactReadOut(artifact=meta, view="source", truncated=head.truncated)
    return _read_answer(read, TextContent(type="text", text=head.text))


def _read_answer(read: ArtifactReadOut, content) -> CallToolResult:
    """The metadata as structured content (and as JSON text first), then the content."""
    doc = read.model_dump(mode="json")
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(doc)), content],
        structured_content=doc,
    )


@tool(title="Store an artifact of a task", idempotent=True)
def artifact_store(
    task_id: Id,
    content: Annotated[str, Field(max_length=2 * MAX_STORE_BYTES)],
    artifact_class: ArtifactClassValue,
    media_type: MediaType = "text/plain",
    title: TitleOrEmpty = "",
    source_refs: Annotated[list[Id], Field(max_length=MAX_SOURCES)] = [],  # noqa: B006
    step_id: Id | None = None,
    encoding: Literal["text", "base64"] = "text",
) -> StoredArtifact:
    """Store a small artifact (up to 1 MiB) that this task persisted; return its ref.

    The bytes are written to the content-addressed store before the row
    that names them (write before show). Bytes you already stored are one
    artifact: the answer then says already_stored=true, and its class,
    title and media type are the earlier row's, which stand. Choose
    artifact_class by how it behaves on resume: 1 file, 2 fetch (can be
    fetched again), 3 snapshot (cannot be reproduced: a search, a live
    quote), 4 render (derived from other artifacts: name them in
    source_refs, so lineage keeps them alive). media_type is type/subtype,
    e.g. text/markdown or image/svg+xml.
    """
    user = current_user()
    media_type_check(media_type, field="media_type")
    task = task_get_for_user(user=user, task_id=task_id)
    data = _content_bytes(content, encoding)
    if not data:
        raise ToolError(ERR_EMPTY)
    if len(data) > MAX_STORE_BYTES:
        raise ToolError(
            ERR_TOO_LARGE.format(
                size=len(data),
                limit=MAX_STORE_BYTES,
                id=task.pk,
                upload_limit=filesizeformat(settings.PIPPA_MAX_UPLOAD_BYTES),
            )
        )
    sources = artifacts_get(user=user, artifact_ids=source_refs)
    artifact = task_artifact_upload(
        task=task,
        step_id=step_id,
        stream=iter([data]),
        media_type=media_type,
        artifact_class=artifact_class,
        title=title,
        source_ids=[s.pk for s in sources],
        max_bytes=MAX_STORE_BYTES,
    )
    already = not getattr(artifact, "_created", True)
    note = None
    if already:
        note = ALREADY_STORED.format(
            id=artifact.pk,
            artifact_class=artifact.artifact_class,
            media_type=artifact.media_type,
            title=artifact.title,
        )
    return StoredArtifact(**_artifact_doc(artifact), already_stored=already, note=note)


# -- council ----------------------------------------------------------------------


@tool(title="Start a council round")
def council_round_start(
    conversation_id: Id,
    topic: Title,
    participants: Annotated[list[Participant], Field(min_length=1, max_length=20)],
) -> RoundOut:
    """Start the next council round of a conversation with named participants.

    Participants speak in the order given; council_context tells each one
    what the earlier speakers said and made (as refs).
    """
    conversation = conversation_get_for_user(
        user=current_user(), conversation_id=conversation_id
    )
    council_round = council_round_create(
        conversation=conversation,
        topic=topic,
        participants=[(p.name, p.brain) for p in _models(participants, Participant)],
    )
    return round_payload(council_round=council_round)


@tool(title="List a conversation's council rounds", read_only=True)
def council_rounds(
    conversation_id: Id, cursor: Cursor = None, limit: Limit = PAGE_ROWS
) -> RoundPage:
    """List a conversation's council rounds, oldest first, with their participants' ids.

    At most limit a page; pass next_cursor as cursor for the next page.
    """
    after = _cursor_read(cursor, "council_rounds")
    conversation = conversation_get_for_user(
        user=current_user(), conversation_id=conversation_id
    )
    rows = rounds_of(conversation=conversation)
    if after is not None:
        rows = rows.filter(number__gt=after)
    page, more = _page_of(rows, limit)
    return RoundPage(
        rounds=[round_payload(council_round=r) for r in page],
        next_cursor=_cursor("council_rounds", page[-1].number) if more else None,
        message=_page_message(
            len(page),
            more=more,
            first=after is None,
            noun="council rounds, oldest first",
            empty=f"Conversation {conversation.pk} has no council rounds yet:"
            " council_round_start starts one.",
        ),
    )


@tool(title="Read a council round's context", read_only=True)
def council_context(round_id: Id, participant_id: Id | None = None) -> CouncilContext:
    """Return the context the next speaker of a council round receives.

    Earlier turns' text and artifact_refs[] (id, sha256, artifact_class,
    class_label, media_type, title, size, source_url, preview_url, preview
    state, source_refs): refs, never payloads. To see a widget, call
    artifact_read with its id: view='source' for the SVG markup,
    view='preview' for the PNG (source_url and preview_url are the JSON
    API's addresses of the same bytes, for an API token). Read-only.
    """
    council_round = round_get_for_user(
        user=current_user(), round_id=round_id, staff=False
    )
    return context_for(council_round=council_round, participant_id=participant_id)


@tool(title="Speak in a council round")
def council_turn_add(
    round_id: Id,
    participant_id: Id,
    text: Annotated[str, Field(max_length=20000)] = "",
    widget_svg: Annotated[str, Field(max_length=MAX_STORE_BYTES)] = "",
    widget_title: TitleOrEmpty = "",
    widget_source_refs: Annotated[list[Id], Field(max_length=MAX_SOURCES)] = [],  # noqa: B006
    cites: Annotated[list[Id], Field(max_length=50)] = [],  # noqa: B006
) -> TurnAdded:
    """Speak in a council round: your text, an optional SVG widget, and citations.

    The widget is stored as a class-4 (render) artifact and its PNG preview
    is rendered now; later speakers receive both as refs in their
    council_context. cites names artifacts (by id) you built on.
    """
    user = current_user()
    council_round = round_get_for_user(user=user, round_id=round_id, staff=False)
    participant = participant_get(
        council_round=council_round, participant_id=participant_id
    )
    if not text.strip() and not widget_svg:
        raise ToolError(ERR_NO_WIDGET_OR_TEXT)
    sources = artifacts_get(user=user, artifact_ids=widget_source_refs)
    cited = artifacts_get(user=user, artifact_ids=cites)
    turn = council_turn_create(
        council_round=council_round,
        participant=participant,
        text=text,
        widget=widget_svg.encode("utf-8") if widget_svg else None,
        widget_title=widget_title,
        widget_source_ids=[s.pk for s in sources],
        cites=[c.pk for c in cited],
    )
    produced = [
        participant_ref(link.artifact, role=link.role)
        for link in turn.artifact_links.filter(
            role=TurnArtifact.Role.PRODUCED
        ).select_related("artifact")
    ]
    return TurnAdded(
        turn_id=turn.pk,
        order=turn.order,
        round_id=council_round.pk,
        artifact_refs=produced,
    )


@tool(title="Conclude a council round", destructive=True)
def council_round_conclude(
    round_id: Id,
    participant_id: Id,
    outcome: Annotated[str, Field(min_length=1, max_length=4000)],
) -> RoundOut:
    """Conclude a council round with its outcome, as its last speaker.

    Only the participant who took the round's last turn may; say in a few
    sentences what was agreed or what the person should do. The round then
    takes no more turns, its page shows the outcome first, and the next
    round's participants receive it in their council_context (earlier_rounds).
    """
    council_round = round_get_for_user(
        user=current_user(), round_id=round_id, staff=False
    )
    participant = participant_get(
        council_round=council_round, participant_id=participant_id
    )
    concluded = round_conclude(
        council_round=council_round,
        outcome=outcome,
        actor=f"participant:{participant.name}",
        participant=participant,
    )
    return round_payload(council_round=concluded)


# -- resources --------------------------------------------------------------------


def _resource_id(raw: str) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ResourceNotFoundError(f"{raw!r} is not an id") from None


def _resource_read(read: Callable[[], Any]) -> Any:
    """Run a resource read as a door: owner-checked, 404 as resource-not-found."""
    try:
        return _connected(guarded(read))()
    except ToolError as exc:
        raise ResourceNotFoundError(str(exc)) from None


@server.resource(
    "pippa://task/{task_id}",
    name="task",
    description="A task and its plan with per-step status and output refs (JSON).",
    mime_type="application/json",
)
def task_resource(task_id: str) -> str:
    def read():
        return _task_doc(
            task_get_for_user(user=current_user(), task_id=_resource_id(task_id))
        )

    return json.dumps(_resource_read(read))


@server.resource(
    "pippa://artifact/{artifact_id}",
    name="artifact",
    description=(
        "An artifact's metadata (JSON) and, for text such as SVG source, its "
        "text; use the artifact_read tool for a widget's PNG preview."
    ),
    mime_type="application/json",
)
def artifact_resource(artifact_id: str) -> str:
    def read():
        artifact = artifact_get(
            user=current_user(), artifact_id=_resource_id(artifact_id)
        )
        doc = _artifact_doc(artifact)
        head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_CHARS)
        if head.is_text and not head.missing:
            doc["text"] = head.text
            doc["truncated"] = head.truncated
        return doc

    return json.dumps(_resource_read(read))


@server.resource(
    "pippa://conversation/{conversation_id}",
    name="conversation",
    description="A conversation and the ids of its tasks, oldest first (JSON).",
    mime_type="application/json",
)
def conversation_resource(conversation_id: str) -> str:
    def read():
        conversation = conversation_get_for_user(
            user=current_user(), conversation_id=_resource_id(conversation_id)
        )
        return _conversation_doc(conversation)

    return json.dumps(_resource_read(read))


# -- listing and completing the resources ----------------------------------------

# resources/list walks the user's rows kind by kind, newest first in each.
RESOURCE_KINDS = ("task", "conversation", "artifact")


def _owned(kind: str, user):
    model = {"task": Task, "conversation": Conversation, "artifact": Artifact}[kind]
    return model.objects.for_user(user).order_by("-id")


def _listed(kind: str, row) -> Resource:
    """How a row shows in resources/list: its address, title and state in words."""
    if kind == "task":
        words = (
            f"task: {row.get_status_display()}, {row.steps_done} of"
            f" {row.steps_total} steps done (conversation {row.conversation_id})"
        )
    elif kind == "conversation":
        words = "conversation: its tasks' ids (list_tasks for their state)"
    else:
        words = (
            f"artifact: class {row.artifact_class}"
            f" ({ArtifactClass(row.artifact_class).label}), {row.media_type},"
            f" {row.size:,} bytes"
        )
    return Resource(
        uri=_uri(kind, row.pk),
        name=f"{kind}-{row.pk}",
        title=row.title or f"{kind} {row.pk}",
        description=words,
        mime_type="application/json",
    )


def resources_page(cursor: str | None) -> ListResourcesResult:
    """One page of the user's tasks, then conversations, then artifacts.

    A page holds rows of one kind; the cursor says which kind and the id the
    page starts after. A cursor this list did not give out is an invalid
    parameter (JSON-RPC -32602), as the protocol asks.
    """
    user = current_user()
    kind, after = RESOURCE_KINDS[0], None
    if cursor is not None:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            listing, kind, after = json.loads(raw)
        except (binascii.Error, ValueError, TypeError):
            listing = None
        if (
            listing != "resources"
            or kind not in RESOURCE_KINDS
            or not (after is None or (type(after) is int))
        ):
            raise MCPError(
                code=INVALID_PARAMS,
                message=ERR_CURSOR.format(cursor=cursor[:40], listing="resources/list"),
            )
    kinds = RESOURCE_KINDS[RESOURCE_KINDS.index(kind) :]
    for position, kind in enumerate(kinds):
        rows = _owned(kind, user)
        if after is not None:
            rows = rows.filter(id__lt=after)
        page, more = _page_of(rows, PAGE_ROWS)
        after = None
        if not page and position + 1 < len(kinds):
            continue
        if more:
            following = json.dumps(["resources", kind, page[-1].pk])
        elif position + 1 < len(kinds):
            following = json.dumps(["resources", kinds[position + 1], None])
        else:
            following = None
        return ListResourcesResult(
            resources=[_listed(kind, row) for row in page],
            next_cursor=None
            if following is None
            else base64.urlsafe_b64encode(following.encode()).decode().rstrip("="),
        )
    return ListResourcesResult(resources=[])


async def _list_resources(ctx, params: PaginatedRequestParams) -> ListResourcesResult:
    return await in_thread(resources_page, params.cursor)


server._lowlevel_server.add_request_handler(
    "resources/list", PaginatedRequestParams, _list_resources
)

# The template variable each kind's id fills.
TEMPLATE_KINDS = {
    "pippa://task/{task_id}": ("task", "task_id"),
    "pippa://artifact/{artifact_id}": ("artifact", "artifact_id"),
    "pippa://conversation/{conversation_id}": ("conversation", "conversation_id"),
}


def id_completions(kind: str, typed: str) -> Completion:
    """The user's ids of ``kind`` that start with what was typed, newest first."""
    if typed and not typed.isdigit():
        return Completion(values=[], total=0, has_more=False)
    rows = _owned(kind, current_user())
    if typed:
        rows = rows.annotate(id_text=Cast("id", CharField())).filter(
            id_text__startswith=typed
        )
    ids = [str(pk) for pk in rows.values_list("id", flat=True)[: MAX_COMPLETIONS + 1]]
    more = len(ids) > MAX_COMPLETIONS
    return Completion(
        values=ids[:MAX_COMPLETIONS],
        total=rows.count() if more else len(ids),
        has_more=more,
    )


@server.completion()
async def complete(ref, argument, context) -> Completion | None:
    """Complete a resource template's id with the user's own ids (no prompts here)."""
    if not isinstance(ref, ResourceTemplateReference):
        return None
    kind, variable = TEMPLATE_KINDS.get(ref.uri, (None, None))
    if kind is None or argument.name != variable:
        return None
    return await in_thread(id_completions, kind, argument.value[:20])
