"""What a brain is told: the system prompt, the opening of each turn and its tools.

The runner (``brains.runner``) sends these every turn; its backends carry
out the tools. Like the runner, this module loads without a Django project:
the limits its tool specs state are the services' own, from ``tasks.limits``.
"""

from __future__ import annotations

from brains.base import ToolSpec
from tasks.limits import MAX_PAGE_STEPS, NOTE_MAX_CHARS

STEP_STATUSES = ["pending", "running", "done", "failed", "needs_review", "skipped"]

SYSTEM_PROMPT = """\
You drive a task whose plan and progress live in Pippa's durable state, not in \
this chat. Each turn begins with the task's resume document, rebuilt from that \
state: the steps counted by status, the step to run next and a few after it \
(with what resume will do), the last few finished steps with their output refs, \
and your own note. Only your latest turns follow it; older ones are not sent \
again, so write anything you must remember with write_note. Never redo \
finished work.
Call run_next_step to run the next unfinished step; its result reaches you only \
after it is saved. Call it again until the task is done, failed or needs review. \
read_steps lists steps the document leaves out, read_artifact reads an output by \
its id, rewrite_plan changes steps that have not run yet (finished steps stay as \
they are). When the task is settled, answer with a short summary and no tool call."""

OPENING = (
    "Task {task_id}. Resume context (pippa.resume/3, rebuilt from durable state"
    " for this turn):\n{document}\n{go_on}"
)
GO_ON_FIRST = "Continue the task from where it stands."
GO_ON_LATER = "Your latest turns follow; go on from the state above."
# What the document says comes next, in one sentence after it.
NEXT_RUNS = " Step {position} ({title}) is next: run_next_step runs it."
NEXT_WAITS = (
    " Step {position} ({title}) waits for a person's decision: nothing runs until then."
)
NOTHING_LEFT = " No step is left to run: answer with a short summary."
# An older turn's result, once the turn after it has its own.
ELIDED = "an earlier result, shortened; the resume context above has the state it left"

TOOL_SPECS = [
    ToolSpec(
        name="run_next_step",
        description=(
            "Run the task's next unfinished step through the durable executor and "
            "return its saved result and the task's progress."
        ),
        parameters={"type": "object", "properties": {}},
    ),
    ToolSpec(
        name="rewrite_plan",
        description=(
            "Replace the plan. List every step in order; give an existing step's id "
            "to keep it. Finished steps must stay first and unchanged."
        ),
        parameters={
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "title": {"type": "string"},
                            "tool": {"type": "string"},
                            "args": {
                                "type": "object",
                                "description": "the tool's keyword arguments",
                                "additionalProperties": True,
                            },
                        },
                        "required": ["title", "tool"],
                    },
                }
            },
            "required": ["steps"],
        },
    ),
    ToolSpec(
        name="read_artifact",
        description=(
            "Read an artifact by id: its metadata, source refs and, for text, "
            "the first few KiB."
        ),
        parameters={
            "type": "object",
            "properties": {"artifact_id": {"type": "integer"}},
            "required": ["artifact_id"],
        },
    ),
    ToolSpec(
        name="read_steps",
        description=(
            "List steps the resume context does not show, in plan order: a range "
            "of positions, or only those with a status. Each has its output's ref."
        ),
        parameters={
            "type": "object",
            "properties": {
                "from_position": {"type": "integer", "minimum": 1},
                "to_position": {"type": "integer", "minimum": 1},
                "status": {"type": "string", "enum": STEP_STATUSES},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_STEPS},
            },
        },
    ),
    ToolSpec(
        name="write_note",
        description=(
            "Save a short note on the task for your later turns (they see only "
            "the resume context and your latest turns). It replaces the last one."
        ),
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": NOTE_MAX_CHARS}},
            "required": ["text"],
        },
    ),
]
