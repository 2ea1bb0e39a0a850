"""MCP tools for conversations, tasks, their plans and the agent's note."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver.exceptions import (
    ToolError,
)
from pydantic import Field

from pippa_mcp.answers import (
    conversation_doc,
    cursor_after,
    cursor_read,
    page_message,
    page_of,
    task_brief,
    task_doc,
)
from pippa_mcp.arguments import (
    PAGE_ROWS,
    Cursor,
    Flag,
    Id,
    Limit,
    PlanItem,
    Position,
    StepIn,
    StepStatus,
    as_models,
)
from pippa_mcp.door import actor, current_user, tool
from pippa_mcp.shapes import (
    ConversationPage,
    StepToolOut,
    StepToolPage,
    TaskDoc,
    TaskPage,
    TaskWithUsage,
)
from tasks.documents import (
    conversation_get_for_user,
    task_get_for_user,
)
from tasks.limits import MAX_PAGE_STEPS, NOTE_MAX_CHARS, PAGE_STEPS
from tasks.models import Brain, Conversation
from tasks.plan import conversation_task_create, plan_rewrite
from tasks.plan import task_create as plan_task_create
from tasks.resume_document import note_document, resume_document, steps_read
from tasks.services import task_note_write
from tasks.shapes import (
    ResumeNoteOut,
    ResumeOut,
    StepCount,
    StepPageOut,
    Title,
    TitleOrEmpty,
)
from tasks.tools import tools_all
from tasks.usage import task_token_usage

ERR_CONVERSATION_CHOICE = (
    "give either conversation_id (an existing conversation) or conversation_title"
    " (a new one), not both and not neither"
)


# A step tool's description as list_step_tools shows it, at most.
TOOL_DESCRIPTION_CHARS = 500


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
    after = cursor_read(cursor, "list_conversations")
    rows = Conversation.objects.for_user(current_user()).order_by("-id")
    if after is not None:
        rows = rows.filter(id__lt=after)
    page, more = page_of(rows, limit)
    return ConversationPage(
        conversations=[conversation_doc(c) for c in page],
        next_cursor=cursor_after("list_conversations", page[-1].pk) if more else None,
        message=page_message(
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
    after = cursor_read(cursor, "list_tasks")
    conversation = conversation_get_for_user(
        user=current_user(), conversation_id=conversation_id
    )
    rows = conversation.tasks.order_by("id")
    if after is not None:
        rows = rows.filter(id__gt=after)
    page, more = page_of(rows, limit)
    return TaskPage(
        tasks=[task_brief(t, refresh=False) for t in page],
        next_cursor=cursor_after("list_tasks", page[-1].pk) if more else None,
        message=page_message(
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
    after = cursor_read(cursor, "list_step_tools")
    rows = sorted(tools_all(), key=lambda t: t.name)
    if after is not None:
        rows = [t for t in rows if t.name > after]
    page, more = page_of(rows, limit)
    return StepToolPage(
        tools=[
            StepToolOut(
                name=t.name,
                artifact_class=t.artifact_class,
                side_effects=t.side_effects,
                media_type=t.media_type,
                description=(t.description or "").strip()[:TOOL_DESCRIPTION_CHARS],
                args_schema=t.args_schema,
            )
            for t in page
        ],
        next_cursor=cursor_after("list_step_tools", page[-1].name) if more else None,
        message=page_message(
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
        "steps": [s.model_dump() for s in as_models(steps, StepIn)],
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
    return task_doc(task)


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
    return {**task_doc(task), "usage": task_token_usage(task=task).as_data()}


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
    items = [s.model_dump(exclude_none=True) for s in as_models(steps, PlanItem)]
    return task_doc(plan_rewrite(task=task, steps=items))


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
    task_note_write(task=task, text=text, actor=actor())
    return note_document(task)
