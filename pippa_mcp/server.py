"""The Model Context Protocol server: tools and resources over Pippa's durable state.

Every tool is a thin door onto the services the JSON API and the dashboard
call (``tasks.plan``, ``tasks.executor`` through ``tasks.actions.step_run``,
``tasks.resume``, ``artifacts``, ``council``); none carries a rule of its own.
The user a call acts as comes from the door that received it (``--user`` or a
token for stdio, the bearer token for HTTP) through ``acting_as``; every read
is owner-checked, and another user's id is reported exactly like a missing one.

An anticipated failure (unknown id, a plan that would change history, a lease
held elsewhere, bad arguments) is a tool error with one plain sentence
(``isError``); nothing a caller sends crashes the server.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from django.db import DatabaseError, DataError, close_old_connections, connections
from django.http import Http404
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import (
    ResourceNotFoundError,
    ToolError,
    UnexpectedToolError,
)
from mcp.types import ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pippa_site.errors import PippaError

log = logging.getLogger("pippa.mcp")

SERVER_NAME = "pippa"
MAX_STORE_BYTES = 1024 * 1024
MAX_SOURCE_CHARS = 256 * 1024
EXCERPT_BYTES = 600
# Seconds between "still running" progress notifications of a long step.
PROGRESS_INTERVAL = 1.0

ERR_NO_USER = "this MCP server is not signed in as any user"
ERR_BAD_ARGS = "bad arguments for {tool}: {reasons}"
ERR_NUL = "text may not contain NUL characters"
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
    f"content is larger than {MAX_STORE_BYTES} bytes; upload big payloads over the"
    " JSON API (POST /api/v1/tasks/{{id}}/artifacts)"
)
ERR_BASE64 = "content is not valid base64 (encoding='base64')"
ERR_NO_WIDGET_OR_TEXT = "a turn needs text or a widget"

INSTRUCTIONS = """\
Pippa keeps a task's plan and every step's output in durable storage, keyed by \
conversation, not by your session. After any interruption (a new session, a \
crash, another agent taking over) call resume_context for the task before doing \
anything else: it says which steps are done, the ref of each output, and what \
resume will do with an unfinished step. Never redo finished work.
Outputs are artifacts with a class that decides what resume does:
1 file (reused if the file is still there and intact), 2 fetch (safe to fetch \
again), 3 snapshot (a search, a live quote: never re-run once saved; reuse it), \
4 render (a widget or chart, re-rendered only from intact sources).
run_next_step answers only after the step's result is saved (write before \
show). Artifacts travel as refs (id, sha256, class); read one with \
artifact_read when you need its source text or its PNG preview."""


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


def _check_text(value: Any) -> None:
    """Refuse NUL anywhere in the arguments (PostgreSQL cannot store it)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ToolError(ERR_NUL)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_text(item)
    elif isinstance(value, BaseModel):
        _check_text(value.model_dump())


def _plain_error(exc: Exception) -> str | None:
    """The plain sentence for a failure a caller can act on, else None."""
    from artifacts.store import BlobError

    if isinstance(exc, Http404):
        return str(exc) or "not found"
    if isinstance(exc, PippaError):
        return str(exc)
    if isinstance(exc, BlobError):
        return "an artifact's payload is missing or damaged in the blob store"
    if isinstance(exc, DataError):
        return "a value is out of range or not storable"
    if isinstance(exc, DatabaseError):
        return ERR_DATABASE
    return None


def door(fn: Callable) -> Callable:
    """Run a synchronous tool body as a door onto the services.

    Runs in a worker thread: give it a fresh database connection and close
    that again afterwards (a worker thread outlives the call), refuse NUL in
    text, and turn the services' anticipated errors into tool errors.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for value in kwargs.values():
            _check_text(value)
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except Exception as exc:
            message = _plain_error(exc)
            if message is None:
                raise
            raise ToolError(message) from None
        finally:
            connections.close_all()

    return wrapper


async def _in_thread(fn: Callable, *args, **kwargs):
    return await anyio.to_thread.run_sync(functools.partial(door(fn), *args, **kwargs))


# -- argument models ---------------------------------------------------------------

ArtifactClassValue = Annotated[
    int,
    Field(ge=1, le=4, description="1 file, 2 fetch, 3 snapshot, 4 render"),
]
StepStatus = Literal["pending", "running", "done", "failed", "needs_review", "skipped"]


class StepIn(BaseModel):
    """One step of a new plan."""

    model_config = ConfigDict(extra="forbid")

    title: Annotated[str, Field(min_length=1, max_length=300)]
    tool: Annotated[
        str,
        Field(min_length=1, max_length=100, description="a name from list_step_tools"),
    ]
    args: dict[str, Any] = Field(
        default_factory=dict, description="small JSON arguments; refs, never payloads"
    )


class PlanItem(BaseModel):
    """One entry of the whole plan, like a todo list item."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = Field(
        default=None, description="an existing step's id: keeps that step"
    )
    title: Annotated[str | None, Field(max_length=300)] = None
    tool: Annotated[str | None, Field(max_length=100)] = None
    args: dict[str, Any] | None = None
    status: StepStatus | None = Field(
        default=None,
        description="the status you believe it has; a different stored status is refused",
    )


class Participant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=100)]
    brain: str = Field(
        default="other",
        max_length=40,
        description="claude, codex, kimi, grok, glm, gemini, ollama or other",
    )


# -- the server ---------------------------------------------------------------------


class PippaMCPServer(MCPServer):
    """MCPServer whose argument errors read as one plain sentence."""

    async def call_tool(self, name, arguments, context=None):
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


def _reasons(error: ValidationError) -> str:
    parts = []
    for err in error.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).rstrip(".")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _uri(kind: str, pk: int) -> str:
    return f"pippa://{kind}/{pk}"


def _task_doc(task) -> dict[str, Any]:
    from tasks.documents import task_payload

    doc = task_payload(task)
    doc["uri"] = _uri("task", task.pk)
    for step in doc["steps"]:
        if step["output"]:
            step["output"]["uri"] = _uri("artifact", step["output"]["id"])
    return json.loads(json.dumps(doc, default=str))


def _excerpt(artifact) -> dict[str, Any]:
    from artifacts.selectors import artifact_text_head

    head = artifact_text_head(artifact=artifact, limit=EXCERPT_BYTES)
    if head.missing:
        return {"excerpt": None, "note": "the payload is missing"}
    if not head.is_text:
        return {"excerpt": None, "note": f"{artifact.media_type}: not text"}
    return {"excerpt": head.text, "truncated": head.truncated}


def _worker(worker: str) -> str:
    from tasks.lease import door_worker_id

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
            result["run"] = await _in_thread(fn)
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
            if not finished.is_set():
                beats += 1
                await ctx.report_progress(
                    done + 1 - 1 / (beats + 1),
                    total,
                    f"{label} (still running, {time.monotonic() - started:.0f}s)",
                )
    if "error" in result:
        raise result["error"]
    return result["run"]


def _step_run_answer(task, run) -> dict[str, Any]:
    """What run_next_step answers: the run, the step and its output ref, the task."""
    task.refresh_from_db()
    out: dict[str, Any] = {
        "ran": run.ran,
        "detail": run.detail,
        "rule": run.rule,
        "step": None,
        "task": {
            "id": task.pk,
            "status": task.status,
            "steps_done": task.steps_done,
            "steps_total": task.steps_total,
            "uri": _uri("task", task.pk),
        },
    }
    step = run.step
    if step is not None:
        output = step.output
        out["step"] = {
            "id": step.pk,
            "position": step.position,
            "title": step.title,
            "status": step.status,
            "error": step.error,
            "artifact_class": step.artifact_class,
            "output": None
            if output is None
            else {
                "id": output.pk,
                "sha256": output.sha256,
                "artifact_class": output.artifact_class,
                "media_type": output.media_type,
                "title": output.title,
                "size": output.size,
                "uri": _uri("artifact", output.pk),
                **_excerpt(output),
            },
        }
    return out


def build_server() -> PippaMCPServer:
    """Return the MCP server with every tool and resource registered."""
    server = PippaMCPServer(
        SERVER_NAME,
        title="Pippa Stateful",
        instructions=INSTRUCTIONS,
        version="1",
    )
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    # -- conversations and tasks --------------------------------------------------

    @server.tool(annotations=read_only)
    @door
    def list_conversations() -> list[dict[str, Any]]:
        """List your conversations, newest first, with the ids of their tasks.

        A conversation holds tasks and council rounds; a task's plan lives here,
        keyed by conversation, so it survives your session ending.
        """
        from tasks.documents import conversation_payload
        from tasks.models import Conversation

        rows = Conversation.objects.owned_by(current_user()).order_by("-updated_at")
        return json.loads(
            json.dumps([conversation_payload(c) for c in rows[:200]], default=str)
        )

    @server.tool(annotations=read_only)
    @door
    def list_tasks(conversation_id: int) -> list[dict[str, Any]]:
        """List the tasks of one conversation with status and progress (no steps).

        Call get_task for a task's plan, or resume_context before continuing it.
        """
        from tasks.documents import conversation_get_for_user

        conversation = conversation_get_for_user(
            user=current_user(), conversation_id=conversation_id
        )
        return [
            {
                "id": t.pk,
                "title": t.title,
                "status": t.status,
                "brain": t.brain,
                "steps_done": t.steps_done,
                "steps_total": t.steps_total,
                "uri": _uri("task", t.pk),
            }
            for t in conversation.tasks.order_by("created_at", "id")
        ]

    @server.tool(annotations=read_only)
    @door
    def list_step_tools() -> list[dict[str, Any]]:
        """List the tools a plan's steps may run, with the artifact class of each.

        The class decides what resume does with the step's output: 1 file
        (reuse if intact), 2 fetch (fetch again), 3 snapshot (never re-run once
        saved), 4 render (re-render only from intact sources). A tool with
        side_effects is never re-run from an uncertain state; a person decides.
        """
        from tasks.tools import tools_all

        return [
            {
                "name": t.name,
                "artifact_class": t.artifact_class,
                "side_effects": t.side_effects,
                "media_type": t.media_type,
                "description": (t.description or "").strip()[:500],
            }
            for t in tools_all()
        ]

    @server.tool()
    @door
    def create_task(
        title: Annotated[str, Field(min_length=1, max_length=300)],
        steps: Annotated[list[StepIn], Field(min_length=1, max_length=200)],
        conversation_id: int | None = None,
        conversation_title: Annotated[str | None, Field(max_length=300)] = None,
        brain: str = "other",
        queue: bool = True,
    ) -> dict[str, Any]:
        """Create a task with its plan (an ordered list of steps) in a conversation.

        Give conversation_id to add it to an existing conversation, or
        conversation_title to start a new one. Each step names a tool from
        list_step_tools; its artifact class is fixed now, so the resume rule of
        every step is known before anything runs. queue=true lets a background
        worker run it too; either way run_next_step runs the next step for you.
        Returns the task with its plan (get_task shape).
        """
        from tasks.documents import conversation_get_for_user
        from tasks.models import Brain
        from tasks.plan import conversation_task_create, task_create

        user = current_user()
        if (conversation_id is None) == (not conversation_title):
            raise ToolError(ERR_CONVERSATION_CHOICE)
        if brain not in Brain.values:
            raise ToolError(
                f"brain must be one of {', '.join(Brain.values)}, not {brain!r}"
            )
        new = {
            "title": title,
            "steps": [s.model_dump() for s in steps],
            "brain": brain,
            "queue": queue,
        }
        if conversation_id is not None:
            conversation = conversation_get_for_user(
                user=user, conversation_id=conversation_id
            )
            task = task_create(conversation=conversation, **new)
        else:
            task = conversation_task_create(
                owner=user, conversation_title=conversation_title, **new
            )
        return _task_doc(task)

    @server.tool(annotations=read_only)
    @door
    def get_task(task_id: int) -> dict[str, Any]:
        """Return a task and its plan: each step's status, tool, attempts and output ref.

        A step's output is a ref (id, sha256, artifact_class, media_type, uri),
        never the payload; read one with artifact_read. artifact_class is the
        resume rule: 1 file, 2 fetch, 3 snapshot (never re-run), 4 render.
        """
        from tasks.documents import task_get_for_user

        return _task_doc(task_get_for_user(user=current_user(), task_id=task_id))

    @server.tool()
    @door
    def rewrite_plan(
        task_id: int,
        steps: Annotated[list[PlanItem], Field(min_length=1, max_length=200)],
    ) -> dict[str, Any]:
        """Replace the task's whole plan, the way you rewrite a todo list.

        List every step in order. Keep an existing step by giving its id (and
        optionally the status you believe it has); add a step by giving title
        and tool without an id; drop a never-run step by leaving it out. Done
        steps must stay first, unchanged, in their order: their outputs stand.
        A rewrite that would change history (edit or drop a done or attempted
        step, or claim a status the step does not have) is refused with the
        reason, and nothing changes; so is a rewrite while a step is running.
        """
        from tasks.documents import task_get_for_user
        from tasks.plan import plan_rewrite

        task = task_get_for_user(user=current_user(), task_id=task_id)
        items = [s.model_dump(exclude_none=True) for s in steps]
        return _task_doc(plan_rewrite(task=task, steps=items))

    @server.tool(annotations=read_only)
    @door
    def resume_context(task_id: int) -> dict[str, Any]:
        """Return the resume context: what a resumed brain reads before continuing.

        Read it first whenever you pick up a task you did not just create (new
        session, another agent, after a crash). It lists every step with its
        status and output ref, the next step, and for an unfinished step the
        rule resume will apply, so you never redo finished work.
        """
        from tasks.documents import task_get_for_user
        from tasks.resume import resume_context as context

        task = task_get_for_user(user=current_user(), task_id=task_id)
        return json.loads(json.dumps(context(task), default=str))

    @server.tool()
    async def run_next_step(
        task_id: int,
        ctx: Context,
        worker: Annotated[
            str,
            Field(
                max_length=60,
                description="your own name, e.g. claude-laptop; the lease is held under it",
            ),
        ] = "",
    ) -> dict[str, Any]:
        """Run the task's next unfinished step and answer once its result is saved.

        The executor takes the task's lease, calls the step's tool, writes the
        output to durable storage and only then answers (write before show):
        you get the step's status, its output ref (id, sha256, class) and a
        short excerpt. A step left uncertain by a crash is resolved by its
        class instead of being blindly re-run. Call again for the next step
        until the task is done, failed or needs review. Sends progress
        notifications while a long step runs. If another worker holds the
        lease you get an error saying until when.
        """
        from tasks.actions import step_run
        from tasks.documents import task_get_for_user
        from tasks.lease import lease_release_own

        user = current_user()
        # One lease per call, given back when the call ends: an agent may never
        # call again, and a second call under the same name must not mistake
        # this one's step for an abandoned one.
        worker_id = f"{_worker(worker)}#{secrets.token_hex(3)}"

        def prepare():
            task = task_get_for_user(user=user, task_id=task_id)
            upcoming = task.steps.not_done().order_by("position").first()
            return task, upcoming

        task, upcoming = await _in_thread(prepare)
        total = max(task.steps_total, 1)
        done = task.steps_done
        label = (
            f"running step {upcoming.position} of {task.steps_total}: {upcoming.title}"
            if upcoming is not None
            else "settling the task"
        )
        await ctx.report_progress(done, total, label)

        def step_and_release():
            try:
                return step_run(task=task, worker_id=worker_id)
            finally:
                try:
                    lease_release_own(task=task, worker_id=worker_id)
                except DatabaseError:
                    log.warning("lease of task %s left to expire", task.pk)

        run = await _with_heartbeats(ctx, step_and_release, done, total, label)
        if run.lease_busy:
            raise ToolError(run.detail)

        out = await _in_thread(_step_run_answer, task, run)
        # Progress only ever grows, so a call that ran nothing sends no second one.
        if out["task"]["steps_done"] > done:
            await ctx.report_progress(
                out["task"]["steps_done"],
                max(out["task"]["steps_total"], 1),
                run.detail,
            )
        return out

    # -- artifacts -----------------------------------------------------------------------

    @server.tool(annotations=read_only)
    @door
    def artifact_read(
        artifact_id: int,
        view: Literal["auto", "source", "preview"] = "auto",
        sha256: Annotated[str, Field(max_length=64)] = "",
    ) -> list[TextContent | ImageContent]:
        """Read an artifact by its ref: its source as text, or its PNG preview as an image.

        view='source' gives an SVG widget's markup or a text payload (capped at
        256 KiB); view='preview' gives the widget's rendered PNG as image content,
        to look at instead of parsing markup; 'auto' picks source for text and
        the image for PNGs. Pass the sha256 from the ref to make sure you read
        the bytes it names. Reading is read-only: no lease, no state change.
        The first content block is the artifact's metadata as JSON.
        """
        from artifacts.preview import preview_artifact_for, preview_status
        from artifacts.selectors import artifact_text_head
        from artifacts.store import BlobError, default_store
        from tasks.documents import artifact_get, artifact_payload

        artifact = artifact_get(user=current_user(), artifact_id=artifact_id)
        if sha256 and sha256.lower() != artifact.sha256:
            raise ToolError(
                ERR_SHA_MISMATCH.format(
                    id=artifact.pk, actual=artifact.sha256, expected=sha256
                )
            )
        meta = json.loads(json.dumps(artifact_payload(artifact), default=str))
        meta["uri"] = _uri("artifact", artifact.pk)
        is_png = artifact.media_type == "image/png"
        if view == "auto":
            view = "preview" if is_png else "source"
        if view == "preview":
            image = preview_artifact_for(artifact)
            if image is None:
                why = preview_status(artifact).get("reason") or ""
                raise ToolError(
                    ERR_NO_PREVIEW.format(
                        id=artifact.pk, reason=f" ({why})" if why else ""
                    )
                )
            try:
                png = default_store().get(image.sha256)
            except BlobError:
                raise ToolError(ERR_BLOB_MISSING.format(id=image.pk)) from None
            meta["preview"] = {"id": image.pk, "sha256": image.sha256}
            return [
                TextContent(type="text", text=json.dumps(meta)),
                ImageContent(
                    type="image",
                    data=base64.b64encode(png).decode("ascii"),
                    mime_type="image/png",
                ),
            ]
        head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_CHARS)
        if not head.is_text:
            raise ToolError(
                ERR_BINARY.format(id=artifact.pk, media_type=artifact.media_type)
            )
        if head.missing:
            raise ToolError(ERR_BLOB_MISSING.format(id=artifact.pk))
        meta["truncated"] = head.truncated
        return [
            TextContent(type="text", text=json.dumps(meta)),
            TextContent(type="text", text=head.text),
        ]

    @server.tool()
    @door
    def artifact_store(
        task_id: int,
        content: Annotated[str, Field(max_length=2 * MAX_STORE_BYTES)],
        artifact_class: ArtifactClassValue,
        media_type: Annotated[str, Field(min_length=1, max_length=255)] = "text/plain",
        title: Annotated[str, Field(max_length=300)] = "",
        source_refs: Annotated[list[int], Field(max_length=50)] = [],  # noqa: B006
        step_id: int | None = None,
        encoding: Literal["text", "base64"] = "text",
    ) -> dict[str, Any]:
        """Store a small artifact (up to 1 MiB) that this task persisted; return its ref.

        The bytes are written to the content-addressed store before the row
        that names them (write before show); the same bytes stored twice are
        one artifact. Choose artifact_class by how it behaves on resume: 1 file,
        2 fetch (can be fetched again), 3 snapshot (cannot be reproduced: a
        search, a live quote), 4 render (derived from other artifacts: name
        them in source_refs, so lineage keeps them alive).
        """
        from tasks.documents import (
            artifact_payload,
            artifacts_get,
            task_get_for_user,
        )
        from tasks.services import task_artifact_upload

        user = current_user()
        task = task_get_for_user(user=user, task_id=task_id)
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise ToolError(ERR_BASE64) from None
        else:
            data = content.encode("utf-8")
        if not data:
            raise ToolError(ERR_EMPTY)
        if len(data) > MAX_STORE_BYTES:
            raise ToolError(ERR_TOO_LARGE)
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
        doc = json.loads(json.dumps(artifact_payload(artifact), default=str))
        doc["uri"] = _uri("artifact", artifact.pk)
        return doc

    # -- council ----------------------------------------------------------------------

    @server.tool()
    @door
    def council_round_start(
        conversation_id: int,
        topic: Annotated[str, Field(min_length=1, max_length=300)],
        participants: Annotated[list[Participant], Field(min_length=1, max_length=20)],
    ) -> dict[str, Any]:
        """Start the next council round of a conversation with named participants.

        Participants speak in the order given; council_context tells each one
        what the earlier speakers said and made (as refs).
        """
        from council.selectors import round_payload
        from council.services import round_start
        from tasks.documents import conversation_get_for_user

        conversation = conversation_get_for_user(
            user=current_user(), conversation_id=conversation_id
        )
        council_round = round_start(
            conversation=conversation,
            topic=topic,
            participants=[(p.name, p.brain) for p in participants],
        )
        return round_payload(council_round=council_round)

    @server.tool(annotations=read_only)
    @door
    def council_rounds(conversation_id: int) -> list[dict[str, Any]]:
        """List a conversation's council rounds with their participants' ids."""
        from council.selectors import rounds_payload
        from tasks.documents import conversation_get_for_user

        conversation = conversation_get_for_user(
            user=current_user(), conversation_id=conversation_id
        )
        return rounds_payload(conversation=conversation)

    @server.tool(annotations=read_only)
    @door
    def council_context(
        round_id: int, participant_id: int | None = None
    ) -> dict[str, Any]:
        """Return the context the next speaker of a council round receives.

        Earlier turns' text and artifact_refs[] (id, sha256, class, media type,
        title, size, preview state, source_refs): refs, never payloads. To see a
        widget, call artifact_read with its id: view='source' for the SVG
        markup, view='preview' for the PNG. Read-only.
        """
        from council.selectors import context_for, round_get_for_user

        council_round = round_get_for_user(user=current_user(), round_id=round_id)
        return context_for(council_round=council_round, participant_id=participant_id)

    @server.tool()
    @door
    def council_turn_add(
        round_id: int,
        participant_id: int,
        text: Annotated[str, Field(max_length=20000)] = "",
        widget_svg: Annotated[str, Field(max_length=MAX_STORE_BYTES)] = "",
        widget_title: Annotated[str, Field(max_length=300)] = "",
        widget_source_refs: Annotated[list[int], Field(max_length=50)] = [],  # noqa: B006
        cites: Annotated[list[int], Field(max_length=50)] = [],  # noqa: B006
    ) -> dict[str, Any]:
        """Speak in a council round: your text, an optional SVG widget, and citations.

        The widget is stored as a class-4 (render) artifact and its PNG preview
        is rendered now; later speakers receive both as refs in their
        council_context. cites names artifacts (by id) you built on.
        """
        from council.models import TurnArtifact
        from council.selectors import participant_get, round_get_for_user
        from council.services import artifact_ref, turn_add
        from tasks.documents import artifacts_get

        user = current_user()
        council_round = round_get_for_user(user=user, round_id=round_id)
        participant = participant_get(
            council_round=council_round, participant_id=participant_id
        )
        if not text.strip() and not widget_svg:
            raise ToolError(ERR_NO_WIDGET_OR_TEXT)
        sources = artifacts_get(user=user, artifact_ids=widget_source_refs)
        cited = artifacts_get(user=user, artifact_ids=cites)
        turn = turn_add(
            council_round=council_round,
            participant=participant,
            text=text,
            widget=widget_svg.encode("utf-8") if widget_svg else None,
            widget_title=widget_title,
            widget_source_ids=[s.pk for s in sources],
            cites=[c.pk for c in cited],
        )
        produced = [
            artifact_ref(link.artifact, role=link.role)
            for link in turn.artifact_links.filter(
                role=TurnArtifact.Role.PRODUCED
            ).select_related("artifact")
        ]
        return {
            "turn_id": turn.pk,
            "order": turn.order,
            "round_id": council_round.pk,
            "artifact_refs": produced,
        }

    # -- resources --------------------------------------------------------------------

    @server.resource(
        "pippa://task/{task_id}",
        name="task",
        description="A task and its plan with per-step status and output refs (JSON).",
        mime_type="application/json",
    )
    def task_resource(task_id: str) -> str:
        from tasks.documents import task_get_for_user

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
        from artifacts.selectors import artifact_text_head
        from tasks.documents import artifact_get, artifact_payload

        def read():
            artifact = artifact_get(
                user=current_user(), artifact_id=_resource_id(artifact_id)
            )
            doc = json.loads(json.dumps(artifact_payload(artifact), default=str))
            doc["uri"] = _uri("artifact", artifact.pk)
            head = artifact_text_head(artifact=artifact, limit=MAX_SOURCE_CHARS)
            if head.is_text and not head.missing:
                doc["text"] = head.text
                doc["truncated"] = head.truncated
            return doc

        return json.dumps(_resource_read(read))

    return server


def _resource_id(raw: str) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ResourceNotFoundError(f"{raw!r} is not an id") from None


def _resource_read(read: Callable[[], Any]) -> Any:
    """Run a resource read as a door: owner-checked, 404 as resource-not-found."""
    try:
        return door(read)()
    except ToolError as exc:
        raise ResourceNotFoundError(str(exc)) from None
