"""Dad's words for the engineer's: the one place the dashboard (and the admin) take them from.

The engineer's terms (rule names, event kinds, "lease", "sha") stay in the
data and in the pages' "details" folds; what a person reads first comes from
here, so a wording is changed once. The one exception is what resume will
do with a step: those words sit in the resume rules' table (``tasks.rules``),
beside the action and the choices they describe.
"""

from __future__ import annotations

import re
from datetime import datetime

from django.utils import timezone
from django.utils.formats import date_format

from artifacts.models import ArtifactClass

# The class badges, in one line each (the task page's legend and badge titles).
CLASS_LEGEND = {
    ArtifactClass.FILE: ("file", "a file Pippa made: reused if it is still there"),
    ArtifactClass.FETCH: ("fetch", "data that can be fetched again safely"),
    ArtifactClass.SNAPSHOT: (
        "snapshot",
        "a one-time answer (a search, a live price): never fetched again",
    ),
    ArtifactClass.RENDER: (
        "render",
        "a picture drawn from other results: drawn again from them if needed",
    ),
}

# What resume will do with an unfinished step is said by its rule, in the
# rules' own table (tasks.rules.RULES: the worker's action, a person's
# choices and these words together).

# The choices on a step that needs a person: (button, what happens).
CHOICES = {
    "adopt": (
        "Use the saved output",
        "Pippa keeps what the call already saved; the tool is not called again.",
    ),
    "rerun": (
        "Run the same call again",
        "The tool is called once more with the same request.",
    ),
    "retry": (
        "Start this step over",
        "The step runs again as a new request, from its first attempt.",
    ),
    "skip": (
        "Skip this step",
        "The step gets no output and the task goes on with the next step.",
    ),
    "fail": (
        "Stop here",
        "The task stops at this step and waits for nobody;"
        " you can still choose another way later, or branch.",
    ),
}
# Said beside a choice that would reach outside Pippa again.
OUTSIDE_RERUN = (
    "A careful service recognises the repeated request and does nothing twice,"
    " but not every service does: check first that the first call did not arrive."
)
OUTSIDE_RETRY = (
    "The outside service sees a brand-new request, so it will act again"
    " (a second message, a second order…)."
)

# How one call of a step's tool ended.
ATTEMPT_WORDS = {
    "running": "running now",
    "done": "finished",
    "failed": "failed",
    "interrupted": "interrupted: its worker stopped before the result was recorded",
    "reused": "finished: the output it had saved was used",
}

# Event kinds as a person says them; the kind itself stays in a title.
EVENT_WORDS = {
    "task_created": "task created",
    "plan_rewritten": "plan changed",
    "task_queued": "queued for a worker",
    "task_finished": "task finished",
    "task_branched": "branched",
    "task_paused": "paused",
    "task_cancelled": "cancelled",
    "lease_taken": "a worker took the task",
    "lease_renewed": "the worker is still on it",
    "lease_released": "the worker let go",
    "lease_taken_over": "another worker took over",
    "tool_call_started": "call started",
    "payload_persisted": "answer saved",
    "tool_result_persisted": "step finished",
    "tool_call_failed": "call failed",
    "uncertain_resolved": "unfinished call sorted out",
    "step_needs_review": "set aside for you",
    "step_retried": "step started over",
    "step_skipped": "step skipped",
    "step_failed": "step failed",
    "step_resolved": "decided by a person",
    "admin_action": "admin action",
    "brain_changed": "brain changed",
    "brain_turn": "the brain answered",
}


def actor_words(actor: str) -> str:
    """Return "dad", "boss (admin)", "dad's runner", "dad's agent", "a worker" for an event's actor."""
    if not actor:
        return "someone"
    role, _, name = str(actor).partition(":")
    if not name:
        return "the demo" if role == "demo" else role
    if role == "user":
        return name
    if role == "staff":
        return f"{name} (admin)"
    if role == "api":
        return f"{name.split(':')[0]}'s runner"
    if role == "mcp":
        return f"{name.split(':')[0]}'s agent"
    if role == "worker":
        return "a worker"
    if role == "participant":
        return name  # a council participant, by the name the round gave it
    return actor


def relative_text(value: datetime, now: datetime | None = None) -> str:
    """Return "just now", "12 s ago", "in 3 min", "2 h 5 min ago", "3 days ago".

    Past a week the date itself ("12 Mar 2026") reads better than a count.
    """
    now = now or timezone.now()
    delta = (value - now).total_seconds()
    if abs(delta) < 1:
        return "just now"
    ahead = delta > 0
    seconds = int(abs(delta))
    if seconds < 60:
        text = f"{seconds} s"
    elif seconds < 3600:
        text = f"{seconds // 60} min"
    elif seconds < 86400:
        hours, minutes = seconds // 3600, seconds % 3600 // 60
        text = f"{hours} h {minutes} min" if minutes else f"{hours} h"
    elif seconds < 7 * 86400:
        days = seconds // 86400
        text = f"{days} day{'s' if days > 1 else ''}"
    else:
        return date_format(timezone.localtime(value), "j M Y")
    return f"in {text}" if ahead else f"{text} ago"


# What went wrong, when all a step kept is an exception: its class, in words.
ERROR_CLASS_WORDS = {
    "ConnectionError": "the service could not be reached",
    "ConnectionRefusedError": "the service could not be reached",
    "ConnectionResetError": "the connection to the service broke off",
    "ConnectionAbortedError": "the connection to the service broke off",
    "TimeoutError": "the service took too long to answer",
    "Timeout": "the service took too long to answer",
    "PermissionError": "Pippa was not allowed to do it",
    "FileNotFoundError": "a file it needed was not there",
    "MemoryError": "the computer ran out of memory",
}
ERROR_UNKNOWN_WORDS = "it stopped with an error (the details are for an engineer)"
_EXCEPTION = re.compile(
    r"^\s*(?:[A-Za-z_]\w*\.)*"
    r"([A-Z]\w*(?:Error|Exception|Timeout|Exit|Interrupt|Refused|Failure|Fault))"
    r"\s*(?::\s*(.*))?$",
    re.DOTALL,
)


def error_words(error: str) -> str:
    """What went wrong, in Dad's words: an error's own sentence without the
    exception's name ("ConnectionError: the service is down" → "the service
    is down"), or the class in words when its message is an engineer's
    (a key, a repr, a traceback). The full text stays in the engineer's fold.
    """
    text = " ".join(str(error or "").split())
    if not text:
        return ""
    match = _EXCEPTION.match(text)
    if match is None:
        return text if _plain(text) else ERROR_UNKNOWN_WORDS
    name, message = match.group(1), (match.group(2) or "").strip()
    if message and _plain(message):
        return message
    return ERROR_CLASS_WORDS.get(name, ERROR_UNKNOWN_WORDS)


def _plain(text: str) -> bool:
    """A sentence a person can read: words, no code, no traceback."""
    return (
        " " in text
        and not any(mark in text for mark in ("{", "}", "Traceback", "<", ">", "\\"))
        and _EXCEPTION.search(text) is None
        and re.search(r"\b[A-Z][a-z]+[A-Z]\w*(?:Error|Exception)\b", text) is None
    )


def media_words(media_type: str) -> str:
    """What a file is, in Dad's words: "a picture", "a table", "data", "text"…
    (its media type stays for an engineer)."""
    media = media_type.split(";")[0].strip().lower()
    if media.startswith("image/"):
        return "a picture"
    if media in ("text/csv", "application/csv"):
        return "a table"
    if media == "text/html":
        return "a web page"
    if media == "application/json" or media.endswith("+json"):
        return "data"
    if media.startswith("text/"):
        return "text"
    if media == "application/pdf":
        return "a document"
    return "a file"


# How a task or a council turn keeps an artifact (artifacts.keepers' roles).
KEEPER_WORDS = {
    "persisted": "made it",
    "referenced": "uses it",
    "produced": "made it",
    "cited": "cites it",
    "context": "was shown it",
    "context received": "was shown it",
}
