"""The JSON API that a brain's runner uses from outside the Django process.

Mounted at ``/api/v1/``; the OpenAPI schema is at ``/api/v1/openapi.json``.
Every endpoint needs ``Authorization: Bearer <token>`` (tokens are made on
/settings/tokens/) and is owner-checked: another user's conversation, task or
artifact answers 404, exactly like one that does not exist. Every error is
JSON ``{"detail": "..."}`` with a 4xx status that says what was wrong (a
service's typed refusal adds its ``code``).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import (
    HttpRequest,
    HttpResponse,
    StreamingHttpResponse,
    UnreadablePostError,
)
from ninja import Field, NinjaAPI, Query, Router, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer
from pydantic import ConfigDict, field_validator

from api.services import token_authenticate
from artifacts.services import MAX_SOURCES
from artifacts.store import BlobIncomplete, BlobMissing, BlobTooLarge, default_store
from council.selectors import (
    context_for,
    round_get_for_user,
    rounds_payload,
    turn_context_bytes,
    turn_get_for_user,
)
from pippa_site import throttle
from pippa_site.errors import LeaseConflict, PippaError, TooMany
from pippa_site.slots import STEP_RUNS
from pippa_site.streaming import stream
from pippa_site.text import MAX_MEDIA_TYPE, TITLE_MAX, json_check, media_type_check
from tasks import actions, lease, plan, services
from tasks.documents import (
    artifact_document,
    artifact_get,
    artifacts_get,
    conversation_document,
    conversation_get_for_user,
    conversation_payload,
    step_complete_document,
    step_run_document,
    task_document,
    task_get_for_user,
    task_payload,
)
from tasks.limits import (
    DOCUMENT_MAX_CHARS,
    DOCUMENT_MIN_CHARS,
    MAX_PAGE_STEPS,
    NOTE_MAX_CHARS,
    PAGE_STEPS,
    WORKER_NAME_MAX,
)
from tasks.models import Brain, Conversation, Step
from tasks.resume_document import note_document, resume_document, steps_read
from tasks.services import task_note_write
from tasks.shapes import (
    ArtifactClassValue,
    ArtifactOut,
    ConversationOut,
    MediaType,
    ResumeNoteOut,
    ResumeOut,
    StepCompleteOut,
    StepCount,
    StepPageOut,
    StepRunOut,
    TaskOut,
    Title,
    TitleOrEmpty,
    ToolName,
)
from tasks.usage import (
    MAX_CALLS,
    MAX_NAME,
    MAX_TOKENS,
    brain_turn_record,
    conversation_token_usage,
    task_token_usage,
)

ERR_AUTH = (
    "missing, unknown, expired or revoked API token (send Authorization: Bearer"
    " <token>, a token from /settings/tokens/; an MCP sign-in's token is for"
    " /mcp/ only)"
)
ERR_BODY_TOO_LARGE = "request body too large: the limit is {limit} bytes"
ERR_UPLOAD_CUT = "the upload was cut off before its end; nothing was stored"
ERR_EMPTY_UPLOAD = "the upload is empty: send the artifact's bytes as the request body"
ERR_BLOB_MISSING = "artifact {id} has lost its payload (the blob is missing)"
ERR_INVALID = "invalid request: {reasons}"
ERR_BASE64 = "content is not valid base64 (encoding=base64)"

BrainName = Literal[tuple(Brain.values)]  # type: ignore[valid-type]


class BearerToken(HttpBearer):
    """A token acts as its own user only, staff or not: every endpoint reaches
    the token owner's conversations, tasks and artifacts, nobody else's.

    A valid token always answers; failing tokens count against the client's
    address with the login policy (``pippa_site.throttle.api_token_user``),
    and past the limit they get 429 with ``Retry-After``.
    """

    def authenticate(self, request: HttpRequest, token: str):
        user = throttle.api_token_user(
            request, raw=token, authenticate=token_authenticate
        )
        if user is not None:
            request.user = user
        return user


api = NinjaAPI(
    title="Pippa Stateful API",
    version="1",
    description=(
        "Durable task state for brains outside the process: plans, steps run by "
        "the executor, resume context, artifacts and the council context. "
        "A token acts as its own user only, staff or not: every endpoint reaches "
        "the token owner's conversations, tasks and artifacts, and another "
        "user's answers 404 exactly like one that does not exist. Failing tokens "
        "are throttled per address with the login policy (429 with Retry-After "
        "when locked out); a valid token always answers."
    ),
    urls_namespace="api",
    auth=BearerToken(),
    # The Swagger page loads its scripts from a CDN, which the site's CSP (and
    # its no-CDN rule) refuses; the schema itself is at /api/v1/openapi.json.
    docs_url=None,
)


# -- errors: always {"detail": "..."} -----------------------------------------


def _fail(status: int, message: str):
    raise HttpError(status, message)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    reasons = []
    for err in exc.errors[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        reasons.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else err["msg"])
    return api.create_response(
        request,
        {
            "detail": ERR_INVALID.format(reasons="; ".join(reasons)),
            # Only the plain parts: pydantic's ctx may hold non-JSON objects.
            "errors": [
                {
                    "loc": [str(p) for p in err.get("loc", ())],
                    "msg": str(err.get("msg", "")),
                    "type": str(err.get("type", "")),
                }
                for err in exc.errors[:50]
            ],
        },
        status=422,
    )


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: Exception) -> HttpResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return api.create_response(
        request, {"detail": ERR_BODY_TOO_LARGE.format(limit=limit)}, status=413
    )


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: Exception) -> HttpResponse:
    response = api.create_response(request, {"detail": ERR_AUTH}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="pippa"'
    return response


@api.exception_handler(throttle.TokenLockedOut)
def _locked_out(request: HttpRequest, exc: throttle.TokenLockedOut) -> HttpResponse:
    response = api.create_response(request, {"detail": str(exc)}, status=429)
    response["Retry-After"] = str(exc.seconds)
    return response


@api.exception_handler(PippaError)
def _refused(request: HttpRequest, exc: PippaError) -> HttpResponse:
    """A service's typed refusal: its status and code come from its type."""
    response = api.create_response(
        request, {"detail": str(exc), "code": exc.code}, status=exc.status
    )
    if isinstance(exc, TooMany):
        response["Retry-After"] = str(exc.retry_after)
    return response


# -- schemas ------------------------------------------------------------------


class Error(Schema):
    detail: str
    code: str | None = Field(
        default=None,
        description="What kind of refusal: invalid, not_found, conflict, lease_held, "
        "too_many (429, see Retry-After), busy (503, see Retry-After).",
    )


class InSchema(Schema):
    """A request body: unknown fields refused, every text checked by the one
    rule (``pippa_site.text``): NUL and unpaired surrogates are a 422 that
    names the field, on SQLite and PostgreSQL alike."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text(cls, value, info):
        return json_check(value, field=info.field_name)


class StepIn(InSchema):
    title: Title
    tool: ToolName
    args: dict[str, Any] = Field(default_factory=dict)


class PlanStepIn(StepIn):
    id: int | None = Field(
        default=None, description="An existing step's id keeps that step."
    )
    status: str | None = Field(
        default=None,
        description="The status you believe the step has; a mismatch is refused (409).",
    )


class ConversationIn(InSchema):
    title: Title


class TaskIn(InSchema):
    title: Title
    steps: Annotated[list[StepIn], StepCount]
    brain: BrainName = "scripted"
    queue: bool = True


class NewTaskIn(TaskIn):
    conversation_title: Title


class PlanIn(InSchema):
    steps: Annotated[list[PlanStepIn], StepCount]


class BrainIn(InSchema):
    brain: BrainName


class WorkerIn(InSchema):
    worker: Annotated[
        str,
        Field(
            min_length=1,
            max_length=WORKER_NAME_MAX,
            description="The runner's own name, e.g. codex-laptop-4121; the lease is held under it.",
        ),
    ]


class TokenUsageOut(Schema):
    """Brain turns recorded on a task (or a conversation's tasks) and their tokens."""

    turns: int
    counted_turns: int = Field(description="Turns whose vendor sent token counts.")
    input_tokens: int
    output_tokens: int
    total_tokens: int


class TaskDetailOut(TaskOut):
    usage: TokenUsageOut


class ConversationDetailOut(ConversationOut):
    usage: TokenUsageOut


TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)]


class TokensIn(InSchema):
    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    total_tokens: TokenCount | None = None


class BrainTurnIn(InSchema):
    """One answer of a brain, as its runner read it (``brains.runner``)."""

    brain: BrainName
    model: Annotated[str, Field(max_length=MAX_NAME)] = ""
    tool_calls: Annotated[int, Field(ge=0, le=MAX_CALLS)] = 0
    bad_calls: Annotated[int, Field(ge=0, le=MAX_CALLS)] = 0
    tokens: TokensIn | None = Field(
        default=None, description="The vendor's counts; null when it sent none."
    )


StepStatusName = Literal[tuple(Step.Status.values)]  # type: ignore[valid-type]


class StepCompleteIn(WorkerIn):
    """What an agent made for a step itself: its output, as text or base64."""

    content: Annotated[
        str,
        Field(
            min_length=1,
            max_length=2 * actions.MAX_OUTPUT_BYTES,
            description="The step's output: text, or base64 with encoding=base64"
            f" (at most {actions.MAX_OUTPUT_BYTES} bytes).",
        ),
    ]
    encoding: Literal["text", "base64"] = "text"
    media_type: MediaType = "text/plain"
    title: TitleOrEmpty = ""
    source_refs: Annotated[list[int], Field(max_length=MAX_SOURCES)] = Field(
        default_factory=list,
        description="Artifacts the output was made from (lineage).",
    )


class NoteIn(InSchema):
    text: Annotated[
        str,
        Field(
            min_length=1,
            max_length=NOTE_MAX_CHARS,
            description="What the brain must remember between turns: refs, not payloads.",
        ),
    ]


def _steps_in(steps: list) -> list[dict]:
    return [s.model_dump(exclude_none=True) for s in steps]


# -- conversations and tasks --------------------------------------------------

conversations = Router(tags=["conversations"])
tasks = Router(tags=["tasks"])
artifacts = Router(tags=["artifacts"])
council = Router(tags=["council"])

NOT_FOUND = {404: Error}
BAD = {400: Error, 404: Error, 409: Error, 413: Error, 422: Error}


@conversations.post("", response={201: ConversationOut, **BAD})
def conversation_create(request: HttpRequest, payload: ConversationIn):
    conv = services.conversation_create(owner=request.user, title=payload.title)
    return Status(201, conversation_document(conv))


@conversations.get("", response=list[ConversationOut])
def conversation_list(request: HttpRequest):
    qs = Conversation.objects.for_user(request.user).order_by("-updated_at")[:200]
    return [conversation_document(c) for c in qs]


@conversations.get(
    "/{conversation_id}", response={200: ConversationDetailOut, **NOT_FOUND}
)
def conversation_detail(request: HttpRequest, conversation_id: int):
    conv = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    usage = conversation_token_usage(conversation=conv).as_data()
    return {**conversation_payload(conv), "usage": usage}


@conversations.post("/{conversation_id}/tasks", response={201: TaskOut, **BAD})
def task_create_in_conversation(
    request: HttpRequest, conversation_id: int, payload: TaskIn
):
    conv = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    task = plan.task_create(
        conversation=conv,
        title=payload.title,
        steps=_steps_in(payload.steps),
        brain=payload.brain,
        queue=payload.queue,
    )
    return Status(201, task_document(task))


@tasks.post("", response={201: TaskOut, **BAD})
def task_create_with_conversation(request: HttpRequest, payload: NewTaskIn):
    """Create a conversation and a task with its plan, in one transaction."""
    task = plan.conversation_task_create(
        owner=request.user,
        conversation_title=payload.conversation_title,
        title=payload.title,
        steps=_steps_in(payload.steps),
        brain=payload.brain,
        queue=payload.queue,
    )
    return Status(201, task_document(task))


@tasks.get("/{task_id}", response={200: TaskDetailOut, **NOT_FOUND})
def task_detail(request: HttpRequest, task_id: int):
    """The task, its plan, and the tokens its brains used (``usage``)."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    return {**task_payload(task), "usage": task_token_usage(task=task).as_data()}


@tasks.put("/{task_id}/plan", response={200: TaskOut, **BAD})
def task_plan_rewrite(request: HttpRequest, task_id: int, payload: PlanIn):
    task = task_get_for_user(user=request.user, task_id=task_id)
    task = plan.plan_rewrite(task=task, steps=_steps_in(payload.steps))
    return task_document(task)


@tasks.post("/{task_id}/brain", response={200: TaskOut, **BAD})
def task_brain(request: HttpRequest, task_id: int, payload: BrainIn):
    """Record which brain drives the task from now on (shown on the dashboard)."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    services.task_brain_record(task=task, brain=payload.brain, actor=_actor(request))
    return task_document(task)


@tasks.post("/{task_id}/brain/turns", response={201: TokenUsageOut, **BAD})
def task_brain_turn(request: HttpRequest, task_id: int, payload: BrainTurnIn):
    """Record one answer of the brain driving the task; return the task's new totals."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    brain_turn_record(task=task, **payload.model_dump())
    return Status(201, task_token_usage(task=task).as_data())


# by_alias: the document's "schema" key (a field of another name in ResumeOut).
@tasks.get("/{task_id}/resume-context", response={200: ResumeOut, **BAD}, by_alias=True)
def task_resume_context(
    request: HttpRequest,
    task_id: int,
    max_chars: Annotated[
        int, Query(ge=DOCUMENT_MIN_CHARS, le=DOCUMENT_MAX_CHARS)
    ] = DOCUMENT_MAX_CHARS,
):
    """The bounded resume document (``pippa.resume/3``) a brain reads before each turn.

    ``max_chars`` asks for a smaller one (a brain with a small context): its
    size rules shorten fields until it fits; it is never cut.
    """
    task = task_get_for_user(user=request.user, task_id=task_id)
    return resume_document(task, max_chars=max_chars)


@tasks.get("/{task_id}/steps", response={200: StepPageOut, **BAD})
def task_steps_read(
    request: HttpRequest,
    task_id: int,
    from_position: Annotated[int, Query(ge=1)] = 1,
    to_position: Annotated[int | None, Query(ge=1)] = None,
    status: StepStatusName | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_STEPS)] = PAGE_STEPS,
):
    """One page of the task's steps in plan order (``read_steps``): a range of
    positions, or only those with a status; ``next_from_position`` starts the next."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    return steps_read(
        task=task,
        from_position=from_position,
        to_position=to_position,
        status=status,
        limit=limit,
    )


@tasks.post(
    "/{task_id}/steps/{step_id}/complete", response={200: StepCompleteOut, **BAD}
)
def task_step_complete(
    request: HttpRequest, task_id: int, step_id: int, payload: StepCompleteIn
):
    """Record a step's output that the agent made itself ("step 2 is done, here it is").

    Stored through the same envelope as a tool's output (write before show;
    the step's artifact class and resume rule stand). Sent twice with the
    same bytes, the second answers ``already``; a finished step, one that
    waits for a decision, or one whose lease another worker holds is refused
    (409). The lease is held only during the call.
    """
    task = task_get_for_user(user=request.user, task_id=task_id)
    if payload.encoding == "base64":
        try:
            data = base64.b64decode(payload.content, validate=True)
        except (binascii.Error, ValueError):
            _fail(400, ERR_BASE64)
    else:
        data = payload.content.encode("utf-8")
    sources = artifacts_get(user=request.user, artifact_ids=payload.source_refs)
    completion = actions.step_complete(
        task=task,
        step_id=step_id,
        data=data,
        media_type=payload.media_type,
        title=payload.title,
        source_ids=[s.pk for s in sources],
        worker_id=_worker_id(request, payload.worker),
    )
    return step_complete_document(completion, task)


@tasks.post("/{task_id}/note", response={201: ResumeNoteOut, **BAD})
def task_note(request: HttpRequest, task_id: int, payload: NoteIn):
    """Save the brain's short note on the task; the resume document shows the last one."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    task_note_write(task=task, text=payload.text, actor=_actor(request))
    return Status(201, note_document(task))


@tasks.post(
    "/{task_id}/steps/run",
    response={200: StepRunOut, **BAD, 429: Error, 503: Error},
)
def task_step_run(request: HttpRequest, task_id: int, payload: WorkerIn):
    """Run the next step through the executor; answer once its result is persisted."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    # At most PIPPA_STEP_RUNS_PER_USER of this user's step runs at once (429),
    # PIPPA_STEP_RUNS for everyone (503); this request's thread is its own.
    with STEP_RUNS.hold(request.user.pk):
        result = actions.step_run(
            task=task, worker_id=_worker_id(request, payload.worker)
        )
    if result.lease_busy:
        raise LeaseConflict(result.detail)
    return step_run_document(result, task)


@tasks.post("/{task_id}/lease/release", response={200: TaskOut, **BAD})
def task_lease_release(request: HttpRequest, task_id: int, payload: WorkerIn):
    """Give back the lease this runner holds (a runner that stops early)."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    lease.lease_release_own(task=task, worker_id=_worker_id(request, payload.worker))
    return task_document(task)


@tasks.post("/{task_id}/resume", response={200: TaskOut, **BAD})
def task_resume(request: HttpRequest, task_id: int):
    """Queue a paused or interrupted task again (refused if a step needs a person)."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    actions.task_resume(task=task, actor=_actor(request))
    return task_document(task)


@tasks.post("/{task_id}/pause", response={200: TaskOut, **BAD})
def task_pause(request: HttpRequest, task_id: int):
    """Pause a queued or running task at its next step boundary (a call in flight is saved)."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    actions.task_pause(task=task, actor=_actor(request))
    return task_document(task)


@tasks.post("/{task_id}/cancel", response={200: TaskOut, **BAD})
def task_cancel(request: HttpRequest, task_id: int):
    """Cancel an unfinished task for good at its next step boundary; branch to go on."""
    task = task_get_for_user(user=request.user, task_id=task_id)
    actions.task_cancel(task=task, actor=_actor(request))
    return task_document(task)


def _actor(request: HttpRequest) -> str:
    """How events name a runner's action through the API."""
    return f"api:{request.user.get_username()}"


def _worker_id(request: HttpRequest, worker: str) -> str:
    return lease.door_worker_id(door="api", user=request.user, worker=worker)


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The artifact's bytes; the Content-Type is its media type.",
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}
            }
        },
    }
}


@tasks.post(
    "/{task_id}/artifacts",
    response={201: ArtifactOut, **BAD},
    openapi_extra=UPLOAD_BODY,
)
def task_artifact_upload(
    request: HttpRequest,
    task_id: int,
    artifact_class: Query[ArtifactClassValue],
    title: Annotated[str, Query(max_length=TITLE_MAX)] = "",
    source_refs: Annotated[list[int], Query(max_length=MAX_SOURCES)] = [],  # noqa: B006
    step_id: int | None = None,
):
    """Upload an artifact's bytes as the raw request body (streamed to the blob store).

    The request's Content-Type is the artifact's media type. ``source_refs``
    name the artifacts it was derived from; each must be one you can read.
    """
    task = task_get_for_user(user=request.user, task_id=task_id)
    limit = settings.PIPPA_MAX_UPLOAD_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        _fail(413, ERR_BODY_TOO_LARGE.format(limit=limit))
    if declared <= 0:
        _fail(400, ERR_EMPTY_UPLOAD)
    sources = artifacts_get(user=request.user, artifact_ids=source_refs)
    media_type = (request.content_type or "application/octet-stream")[:MAX_MEDIA_TYPE]
    media_type_check(media_type, field="Content-Type")
    try:
        artifact = services.task_artifact_upload(
            task=task,
            step_id=step_id,
            stream=iter(lambda: request.read(64 * 1024), b""),
            media_type=media_type,
            artifact_class=artifact_class,
            title=title,
            source_ids=[s.pk for s in sources],
            max_bytes=limit,
            expected_size=declared,
        )
    except BlobTooLarge:
        _fail(413, ERR_BODY_TOO_LARGE.format(limit=limit))
    except BlobIncomplete as exc:
        _fail(400, str(exc))
    except (UnreadablePostError, OSError):
        # The client went away mid-body; nothing was stored. If it can still
        # read, it learns so.
        _fail(400, ERR_UPLOAD_CUT)
    return Status(201, artifact_document(artifact))


# -- artifacts ----------------------------------------------------------------


@artifacts.get("/{artifact_id}", response={200: ArtifactOut, **NOT_FOUND})
def artifact_detail(request: HttpRequest, artifact_id: int):
    return artifact_document(artifact_get(user=request.user, artifact_id=artifact_id))


@artifacts.get(
    "/{artifact_id}/content",
    response={200: None, **NOT_FOUND, 410: Error},
    openapi_extra={
        "responses": {
            200: {
                "description": "The payload bytes",
                "content": {
                    "application/octet-stream": {
                        "schema": {"type": "string", "format": "binary"}
                    }
                },
            }
        }
    },
)
def artifact_content(request: HttpRequest, artifact_id: int):
    """Stream the artifact's bytes (read-only: no lease, no state change)."""
    artifact = artifact_get(user=request.user, artifact_id=artifact_id)
    store = default_store()
    try:
        chunks = store.iter_chunks(artifact.sha256, chunk_size=64 * 1024)
        store.size(artifact.sha256)
    except BlobMissing:
        _fail(410, ERR_BLOB_MISSING.format(id=artifact_id))
    response = StreamingHttpResponse(
        stream(request, chunks), content_type="application/octet-stream"
    )
    response["Content-Length"] = str(artifact.size)
    response["X-Content-Type-Options"] = "nosniff"
    response["X-Pippa-Media-Type"] = artifact.media_type
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Content-Disposition"] = f'attachment; filename="artifact-{artifact.pk}"'
    return response


# -- council ------------------------------------------------------------------


class ParticipantOut(Schema):
    id: int
    name: str
    brain: str
    position: int


class OutcomeOut(Schema):
    text: str
    by: str
    at: str


class RoundOut(Schema):
    id: int
    number: int
    topic: str
    # What the round concluded (council.services.round_conclude); null while open.
    outcome: OutcomeOut | None
    participants: list[ParticipantOut]


@conversations.get(
    "/{conversation_id}/council", response={200: list[RoundOut], **NOT_FOUND}
)
def council_rounds(request: HttpRequest, conversation_id: int):
    """The council rounds of a conversation, with their participants."""
    conv = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    return rounds_payload(conversation=conv)


@council.get("/rounds/{round_id}/context", response={200: dict[str, Any], **NOT_FOUND})
def council_context(
    request: HttpRequest, round_id: int, participant_id: int | None = None
):
    """The branch context the next speaker (or ``participant_id``) receives.

    Earlier turns' text and ``artifact_refs[]`` (refs, never payloads); read an
    artifact's bytes with GET /artifacts/{id}/content. Read-only.
    """
    council_round = round_get_for_user(user=request.user, round_id=round_id)
    return context_for(council_round=council_round, participant_id=participant_id)


@council.get("/turns/{turn_id}/context", response={200: dict[str, Any], **NOT_FOUND})
def council_turn_context(request: HttpRequest, turn_id: int):
    """The context document that turn's speaker received, as it was stored."""
    turn = turn_get_for_user(user=request.user, turn_id=turn_id)
    return json.loads(turn_context_bytes(turn=turn))


api.add_router("/conversations", conversations)
api.add_router("/tasks", tasks)
api.add_router("/artifacts", artifacts)
api.add_router("/council", council)
