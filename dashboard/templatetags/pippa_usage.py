"""``{% token_usage task %}`` / ``{% token_usage conversation %}``: tokens its brains used.

One line for Dad ("This task used 12,480 tokens over 14 brain turns"),
from the counters ``tasks.usage`` keeps on each task (no event is read);
nothing at all while no brain has answered.
"""

from __future__ import annotations

from django import template

from tasks.models import Conversation
from tasks.usage import conversation_token_usage, task_token_usage

register = template.Library()


@register.inclusion_tag("dashboard/_token_usage.html")
def token_usage(obj) -> dict:
    """Return the line's figures for a task, or for a conversation's tasks."""
    if isinstance(obj, Conversation):
        usage, of = conversation_token_usage(conversation=obj), "conversation"
    else:
        # The page has just loaded the task: its counters are on it.
        usage, of = task_token_usage(task=obj, fresh=False), "task"
    return {
        "usage": usage,
        "of": of,
        "total": f"{usage.total_tokens:,}",
        "read": f"{usage.input_tokens:,}",
        "written": f"{usage.output_tokens:,}",
        "uncounted": usage.turns - usage.counted_turns,
    }
