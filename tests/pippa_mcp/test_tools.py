"""The MCP tools as plain functions, called without the protocol.

Each tool is a module-level function of ``pippa_mcp.server``; inside
``acting_as(user)`` it is the door a token's agent reaches, with the same
owner checks, text rule and refusals as over stdio or HTTP.
"""

from __future__ import annotations

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from artifacts.models import Artifact
from council.models import Turn
from council.services import round_start
from pippa_mcp import server
from pippa_mcp.server import acting_as
from pippa_site.text import MAX_JSON_DEPTH
from tasks.models import Conversation, Event, Step, Task
from tasks.plan import task_create
from tasks.words import CHOICES, OUTSIDE_RERUN, actor_words
from tests.pippa_mcp.conftest import PLAN
from tests.support.asyncrun import run_async
from tests.support.executing import crash_at, expire_lease, run_task

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
LONE_SURROGATE = "a\ud800b"


def _nested(depth: int, leaf="x"):
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.fixture
def dad(user):
    return user


@pytest.fixture
def boss(make_user):
    return make_user(username="boss", is_staff=True, is_superuser=True)


@pytest.fixture
def dads_task(dad):
    conversation = Conversation.objects.create(owner=dad, title="PIPA")
    return task_create(conversation=conversation, title="Brief", steps=PLAN)


def _waiting_for_a_decision(dad) -> Task:
    """A task whose outside-effect step was cut off mid-call by a dead worker."""
    conversation = Conversation.objects.create(owner=dad, title="Mail")
    task = task_create(
        conversation=conversation,
        title="Send the report",
        steps=[{"title": "Email the report", "tool": "test.effect", "args": {}}],
    )
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    task.refresh_from_db()
    return task


# -- plain functions -----------------------------------------------------------


def test_each_tool_is_a_module_level_function_registered_on_the_module_server():
    assert server.build_server() is server.server
    names = {t.name for t in run_async(server.server.list_tools)}
    for name in names:
        assert callable(getattr(server, name)), name
    assert {"pause_task", "resume_task", "cancel_task", "decide_step"} <= names


def test_a_tool_called_directly_reads_as_the_acting_user(dad, dads_task, make_user):
    with acting_as(dad):
        task = server.get_task(task_id=dads_task.pk)
    with acting_as(make_user(username="mallory")), pytest.raises(ToolError) as refused:
        server.get_task(task_id=dads_task.pk)

    assert [s["title"] for s in task["steps"]] == [s["title"] for s in PLAN]
    assert str(refused.value) == f"task {dads_task.pk} not found (or not yours)"


def test_a_tool_called_outside_any_user_is_refused(dads_task):
    with pytest.raises(ToolError, match="not signed in as any user"):
        server.get_task(task_id=dads_task.pk)


# -- staff tokens act as their own user ------------------------------------------


def test_a_staff_token_cannot_read_or_speak_in_another_users_council_round(dad, boss):
    conversation = Conversation.objects.create(owner=dad, title="Council")
    council_round = round_start(
        conversation=conversation, topic="PIPA", participants=[("claude", "claude")]
    )
    participant = council_round.participants.get()

    with acting_as(boss):
        with pytest.raises(ToolError) as read:
            server.council_context(round_id=council_round.pk)
        with pytest.raises(ToolError) as spoke:
            server.council_turn_add(
                round_id=council_round.pk, participant_id=participant.pk, text="mine"
            )
    with acting_as(dad):
        own = server.council_context(round_id=council_round.pk)

    assert str(read.value) == str(spoke.value) == "No such council round."
    assert not Turn.objects.exists()
    assert own["round"]["id"] == council_round.pk


def test_a_staff_token_sees_none_of_another_users_tasks_or_artifacts(
    dad, boss, dads_task, make_artifact
):
    artifact = make_artifact(owner=dad)
    with acting_as(boss):
        listed = server.list_conversations()
        with pytest.raises(ToolError, match="not found"):
            server.decision_choices(task_id=dads_task.pk)
        with pytest.raises(ToolError, match="not found"):
            server.pause_task(task_id=dads_task.pk)
        with pytest.raises(ToolError, match="not found"):
            server.artifact_read(artifact_id=artifact.pk)

    assert listed["conversations"] == []
    assert listed["message"].startswith("You have no conversations yet")
    assert Task.objects.get(pk=dads_task.pk).status == Task.Status.QUEUED


# -- pause, resume, cancel ----------------------------------------------------------


def test_pause_resume_and_cancel_go_through_the_same_actions_as_the_dashboard(
    dad, dads_task
):
    with acting_as(dad):
        paused = server.pause_task(task_id=dads_task.pk)
        resumed = server.resume_task(task_id=dads_task.pk)
        cancelled = server.cancel_task(task_id=dads_task.pk)
        with pytest.raises(ToolError) as again:
            server.resume_task(task_id=dads_task.pk)

    assert paused["task"]["status"] == "paused"
    assert resumed["task"]["status"] == "queued"
    assert cancelled["task"]["status"] == "cancelled"
    assert "cancelled" in str(again.value)
    actors = Event.objects.filter(
        task=dads_task, kind__in=["task_paused", "task_cancelled"]
    ).values_list("data__actor", flat=True)
    assert set(actors) == {"mcp:dad"}
    assert actor_words("mcp:dad") == "dad's agent"


# -- deciding a waiting step ----------------------------------------------------------


def test_decision_choices_are_the_dashboards_choices_in_the_same_words(
    dad, client, tool_log
):
    task = _waiting_for_a_decision(dad)
    with acting_as(dad):
        (waiting,) = server.decision_choices(task_id=task.pk)["decisions"]
    client.force_login(dad)
    page = client.get(task.get_absolute_url()).content.decode()

    assert waiting["title"] == "Email the report"
    assert [c["action"] for c in waiting["choices"]] == ["rerun", "fail", "skip"]
    for choice in waiting["choices"]:
        assert (choice["label"], choice["words"]) == CHOICES[choice["action"]]
        assert choice["label"] in page
    rerun = waiting["choices"][0]
    assert rerun["needs_confirm"] is True
    assert rerun["warning"] == OUTSIDE_RERUN
    assert waiting["plain_words"].startswith("This step acts outside Pippa")


def test_sending_an_outside_call_again_needs_confirm_as_on_the_dashboard(dad, tool_log):
    task = _waiting_for_a_decision(dad)
    step = task.steps.get()
    with acting_as(dad):
        with pytest.raises(ToolError) as unconfirmed:
            server.decide_step(task_id=task.pk, step_id=step.pk, action="rerun")
        unchanged = Step.objects.get(pk=step.pk).status
        decided = server.decide_step(
            task_id=task.pk, step_id=step.pk, action="rerun", confirm=True
        )

    assert OUTSIDE_RERUN in str(unconfirmed.value)
    assert "confirm=true" in str(unconfirmed.value)
    assert unchanged == Step.Status.RUNNING
    assert decided["step"]["status"] == "pending"
    assert decided["task"]["status"] == "queued"
    assert decided["message"] == "step 1: Run the same call again"
    resolved = Event.objects.get(task=task, kind="step_resolved")
    assert resolved.data["actor"] == "mcp:dad"
    assert resolved.data["action"] == "rerun"


def test_a_choice_the_card_does_not_offer_is_refused_naming_the_ones_it_does(
    dad, tool_log, dads_task
):
    task = _waiting_for_a_decision(dad)
    step = task.steps.get()
    with acting_as(dad):
        with pytest.raises(ToolError) as adopt:
            server.decide_step(task_id=task.pk, step_id=step.pk, action="adopt")
        with pytest.raises(ToolError) as not_waiting:
            server.decide_step(
                task_id=dads_task.pk,
                step_id=dads_task.steps.first().pk,
                action="skip",
            )
        with pytest.raises(ToolError) as foreign_step:
            server.decide_step(task_id=dads_task.pk, step_id=step.pk, action="skip")
        skipped = server.decide_step(task_id=task.pk, step_id=step.pk, action="skip")

    assert "the choices are: rerun, fail, skip" in str(adopt.value)
    assert "waits for no decision" in str(not_waiting.value)
    assert f"step {step.pk} is not a step of task {dads_task.pk}" == str(
        foreign_step.value
    )
    assert skipped["task"]["status"] == "done"


def test_another_user_cannot_decide_dads_waiting_step(dad, make_user, tool_log):
    task = _waiting_for_a_decision(dad)
    step = task.steps.get()
    with acting_as(make_user(username="mallory")), pytest.raises(ToolError) as refused:
        server.decide_step(task_id=task.pk, step_id=step.pk, action="skip")

    assert str(refused.value) == f"task {task.pk} not found (or not yours)"
    assert Step.objects.get(pk=step.pk).status == Step.Status.RUNNING


# -- queue=false and the refusals' way forward -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_task_created_unqueued_runs_after_resume_task_and_says_so_before(dad):
    with acting_as(dad):
        task = server.create_task(
            title="t", conversation_title="c", steps=PLAN[:1], queue=False
        )

    async def run_once():
        with acting_as(dad):
            return await server.run_next_step(task_id=task["id"])

    before = run_async(run_once)
    with acting_as(dad):
        server.resume_task(task_id=task["id"])
    after = run_async(run_once)

    assert task["status"] == "paused"
    assert before["ran"] is False
    assert before["detail"] == server.MCP_PAUSED
    assert "/api/" not in before["detail"]
    assert after["ran"] is True
    assert after["step"]["status"] == "done"


def test_create_tasks_description_says_what_runs_an_unqueued_task():
    description = server.create_task.__doc__
    assert "queue=false creates it paused" in description
    assert "resume_task" in description


# -- the text rule on every argument, at any depth ---------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("create_task", {"title": NUL, "conversation_title": "c", "steps": PLAN}),
        (
            "create_task",
            {
                "title": "t",
                "conversation_title": "c",
                "steps": [{**PLAN[0], "args": _nested(10, NUL)}],
            },
        ),
        (
            "create_task",
            {
                "title": "t",
                "conversation_title": "c",
                "steps": [{**PLAN[0], "args": {LONE_SURROGATE: 1}}],
            },
        ),
        (
            "artifact_store",
            {"task_id": 1, "content": "x", "artifact_class": 2, "title": NUL},
        ),
        (
            "council_turn_add",
            {"round_id": 1, "participant_id": 1, "text": LONE_SURROGATE},
        ),
        ("artifact_read", {"artifact_id": 1, "sha256": NUL}),
    ],
)
def test_unstorable_text_in_any_argument_is_refused_before_anything_is_read(
    dad, tool, arguments
):
    with acting_as(dad), pytest.raises(ToolError) as refused:
        getattr(server, tool)(**arguments)

    assert "cannot be stored (NUL or an unpaired surrogate)" in str(refused.value)
    assert not Task.objects.exists()


def test_the_worker_name_of_run_next_step_is_checked_too(dad):
    async def run():
        with acting_as(dad):
            return await server.run_next_step(task_id=1, worker=NUL)

    with pytest.raises(ToolError) as refused:
        run_async(run)

    assert str(refused.value).startswith("worker contains a character that cannot")


def test_arguments_nested_past_the_cap_are_refused_not_passed_on_unchecked(dad):
    steps = [{**PLAN[0], "args": _nested(MAX_JSON_DEPTH + 10, NUL)}]
    flat_enough = [{**PLAN[0], "args": _nested(MAX_JSON_DEPTH - 2)}]
    with acting_as(dad):
        with pytest.raises(ToolError) as refused:
            server.create_task(title="t", conversation_title="c", steps=steps)
        assert not Task.objects.exists()
        made = server.create_task(title="t", conversation_title="c", steps=flat_enough)

    assert str(refused.value) == (
        f"steps is nested more than {MAX_JSON_DEPTH} levels deep; send flatter JSON"
    )
    assert made["status"] == "queued"


# -- media types and storing the same bytes twice ----------------------------------------


@pytest.mark.parametrize(
    "media_type", ["text/plain\r\nX-Evil: 1", "plain", "text/", "text/plain; charset"]
)
def test_a_media_type_that_is_not_type_subtype_is_refused(dad, dads_task, media_type):
    with acting_as(dad), pytest.raises(ToolError) as refused:
        server.artifact_store(
            task_id=dads_task.pk,
            content="hello",
            artifact_class=2,
            media_type=media_type,
        )

    assert "media_type must be a media type such as text/plain" in str(refused.value)
    assert not Artifact.objects.exists()


def test_storing_bytes_already_stored_says_so_and_names_the_earlier_row(dad, dads_task):
    with acting_as(dad):
        first = server.artifact_store(
            task_id=dads_task.pk,
            content="closes 101, 102",
            artifact_class=2,
            media_type="text/csv",
            title="Closes",
        )
        second = server.artifact_store(
            task_id=dads_task.pk,
            content="closes 101, 102",
            artifact_class=3,
            media_type="text/plain",
            title="Another title",
        )

    assert first["already_stored"] is False
    assert first["note"] is None
    assert second["already_stored"] is True
    assert second["id"] == first["id"]
    assert (second["artifact_class"], second["media_type"], second["title"]) == (
        2,
        "text/csv",
        "Closes",
    )
    assert f"already stored as artifact {first['id']}" in second["note"]
    assert Artifact.objects.count() == 1


# -- lists: pages with a cursor, and a sentence when empty ---------------------------------


def test_a_list_is_read_page_by_page_with_the_cursor_it_gives(dad):
    for i in range(3):
        Conversation.objects.create(owner=dad, title=f"c{i}")
    with acting_as(dad):
        first = server.list_conversations(limit=2)
        second = server.list_conversations(cursor=first["next_cursor"], limit=2)

    assert [c["title"] for c in first["conversations"]] == ["c2", "c1"]
    assert first["message"] == (
        "2 conversations, newest first; more on the next page (pass next_cursor)."
    )
    assert [c["title"] for c in second["conversations"]] == ["c0"]
    assert second["next_cursor"] is None
    assert second["conversations"][0]["uri"].startswith("pippa://conversation/")


def test_a_cursor_made_up_or_from_another_list_is_refused(dad, dads_task):
    Conversation.objects.create(owner=dad, title="second")
    with acting_as(dad):
        page = server.list_conversations(limit=1)
        with pytest.raises(ToolError) as borrowed:
            server.list_tasks(
                conversation_id=dads_task.conversation_id, cursor=page["next_cursor"]
            )
        with pytest.raises(ToolError) as made_up:
            server.list_conversations(cursor="not-a-cursor")

    assert "is not one list_tasks gave out; leave it out" in str(borrowed.value)
    assert "is not one list_conversations gave out" in str(made_up.value)


def test_every_list_says_in_words_when_there_is_nothing_in_it(dad, dads_task):
    empty = Conversation.objects.create(owner=dad, title="empty")
    with acting_as(dad):
        tasks = server.list_tasks(conversation_id=empty.pk)
        decisions = server.decision_choices(task_id=dads_task.pk)
        rounds = server.council_rounds(conversation_id=empty.pk)

    assert tasks["tasks"] == []
    assert tasks["message"] == (
        f"Conversation {empty.pk} has no tasks yet: create_task with"
        f" conversation_id={empty.pk} adds one."
    )
    assert decisions["decisions"] == []
    assert decisions["message"] == (
        f"No step of task {dads_task.pk} waits for a decision (the task is queued)."
    )
    assert rounds["message"].startswith(
        f"Conversation {empty.pk} has no council rounds"
    )


def test_list_step_tools_gives_each_tools_arguments_as_a_json_schema(dad):
    with acting_as(dad):
        tools = server.list_step_tools(limit=server.MAX_PAGE)["tools"]

    chart = next(t for t in tools if t["name"] == "demo.chart")
    source = chart["args_schema"]["properties"]["source"]
    assert source["type"] == "integer"
    assert source["default"] == 2
    assert "position" in source["description"]
    assert chart["args_schema"]["additionalProperties"] is False
    assert [t["name"] for t in tools] == sorted(t["name"] for t in tools)


# -- no dead ends ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_next_step_on_a_failed_step_points_to_decision_choices(dad, settings):
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    conversation = Conversation.objects.create(owner=dad, title="flaky")
    task = task_create(
        conversation=conversation,
        title="flaky",
        steps=[
            {
                "title": "Flaky fetch",
                "tool": "test.flaky",
                "args": {"fail_times": 5},
                "max_attempts": 3,
            }
        ],
    )
    run_task(task.pk)

    async def run_once():
        with acting_as(dad):
            return await server.run_next_step(task_id=task.pk)

    answer = run_async(run_once)
    with acting_as(dad):
        (waiting,) = server.decision_choices(task_id=task.pk)["decisions"]

    assert answer["ran"] is False
    assert answer["detail"] == (
        "step 1 is failed: it waits for a decision; call decision_choices for the"
        " ways forward, then decide_step"
    )
    assert answer["step"]["status"] == "failed"
    assert waiting["position"] == 1


def test_the_over_1_mib_refusal_names_the_task_and_the_upload_address(dad, dads_task):
    with acting_as(dad), pytest.raises(ToolError) as refused:
        server.artifact_store(
            task_id=dads_task.pk,
            content="x" * (server.MAX_STORE_BYTES + 1),
            artifact_class=2,
        )

    text = str(refused.value)
    assert "{" not in text
    assert f"POST /api/v1/tasks/{dads_task.pk}/artifacts" in text
    assert f"content is {server.MAX_STORE_BYTES + 1:,} bytes" in text
