"""The demo's shared pieces: the live task Dad watches advance.

``pippa_demo`` loads the demo; the dashboard's "Run the demo task" button, a
second ``pippa_demo`` run and Dad's own login (``live_task_on_login``) start a
fresh live task here once the last one has finished, so there is something
moving when Dad first looks, however long after ``make run`` that is.
"""

from __future__ import annotations

DEMO_USER = "dad"
LIVE_CONVERSATION = "Pippa Paper's shares: watch a task at work"
LIVE_TASK_TITLE = "Chart Pippa Paper's shares, step by step"
LIVE_PAUSE = 15  # seconds per step of the live demo task
LIVE_QUERIES = ("second mill", "PIPA dividend", "PIPA guidance", "mill outage")


def four_steps(pause: float = 0) -> list[dict]:
    extra = {"pause": pause} if pause else {}
    return [
        {
            "title": "Draw a title card",
            "tool": "demo.image",
            "args": {"text": "PIPA, first half of 2024", **extra},
        },
        {
            "title": "Fetch unadjusted daily closes",
            "tool": "demo.closes",
            "args": {
                "symbol": "PIPA",
                "start": "2024-01-02",
                "end": "2024-06-28",
                **extra,
            },
        },
        {
            "title": "Search the news",
            "tool": "demo.search",
            "args": {"query": "PIPA dividend mill", **extra},
        },
        {
            "title": "Chart the closes",
            "tool": "demo.chart",
            "args": {"source": 2, "title": "PIPA daily closes, H1 2024", **extra},
        },
    ]


def live_steps() -> list[dict]:
    # Slow enough (about two minutes) that someone who just logged in (which
    # starts a fresh one) still finds it moving.
    return four_steps(pause=LIVE_PAUSE) + [
        {
            "title": f"Search again: {query}",
            "tool": "demo.search",
            "args": {"query": query, "pause": LIVE_PAUSE},
        }
        for query in LIVE_QUERIES
    ]


def live_task_start(*, conversation):
    """Queue a fresh live demo task in ``conversation`` for the worker."""
    # The tool registry imports this package (for tasks.demo.tools) perhaps
    # before the apps are ready; tasks.plan needs the models.
    from tasks.plan import task_create

    return task_create(
        conversation=conversation, title=LIVE_TASK_TITLE, steps=live_steps()
    )


def live_task_running(conversation) -> bool:
    from tasks.models import Task

    return conversation.tasks.filter(
        status__in=[Task.Status.QUEUED, Task.Status.RUNNING]
    ).exists()


def live_task_on_login(sender, *, request, user, **kwargs) -> None:
    """Dad logs in: if the demo's live task has finished, start a fresh one,
    so he finds one moving (``user_logged_in``; the demo user only)."""
    if getattr(user, "username", None) != DEMO_USER:
        return
    from tasks.models import Conversation

    conversation = Conversation.objects.filter(
        owner=user, title=LIVE_CONVERSATION
    ).first()
    if conversation is not None and not live_task_running(conversation):
        live_task_start(conversation=conversation)
