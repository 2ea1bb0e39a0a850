"""What resume will do with a step, in words: resume_advice.

The document a resumed brain reads is tests/tasks/test_resume_document.py's.
"""

from __future__ import annotations

import pytest

from tasks.models import Step
from tasks.plan import task_create
from tasks.resume import resume_advice
from tests.support.executing import crash_at, expire_lease, run_task


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tool", "boundary", "words"),
    [
        ("test.fetch", "after_payload", "will fetch again"),
        ("test.snapshot", "after_payload", "will reuse the saved snapshot"),
        (
            "test.snapshot",
            "after_tool",
            "will issue the call again: no snapshot was saved, so none was shown",
        ),
        ("test.file", "after_payload", "will reuse the saved file (its sha matches)"),
        ("test.effect", "after_started", "needs you: the tool has outside effects"),
    ],
)
def test_resume_advice_says_in_plain_words_what_resume_will_do(
    make_conversation, tool, boundary, words
):
    task = task_create(
        conversation=make_conversation(),
        title="one",
        steps=[{"title": "one", "tool": tool, "args": {}}],
    )
    crash_at(task.pk, boundary)
    the_step = Step.objects.get(task=task)
    # While the crashed worker's lease is live, the step is shown as running.
    assert resume_advice(the_step).rule == "in_progress"
    expire_lease(task.pk)
    assert resume_advice(Step.objects.get(task=task)).words == words


@pytest.mark.django_db
def test_resume_advice_for_settled_steps(make_conversation):
    task = task_create(
        conversation=make_conversation(),
        title="flaky",
        steps=[
            {
                "title": "flaky",
                "tool": "test.flaky",
                "args": {"fail_times": 9},
                "max_attempts": 1,
            },
            {"title": "later", "tool": "test.fetch", "args": {}},
        ],
    )
    first, later = Step.objects.filter(task=task).order_by("position")
    assert resume_advice(later).words == "will run (attempt 1 of 3)"
    run_task(task.pk)
    first.refresh_from_db()
    assert (
        resume_advice(first).words == "failed after 1 attempt(s): retry it to run again"
    )
