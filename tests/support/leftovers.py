"""One reusable checker for every deletion door: no table or blob is left behind.

Use it around any door (service, model, queryset, admin, dashboard, API)::

    before = subtree_snapshot(conversation.pk)
    ...delete through the door (let on_commit callbacks run)...
    assert_no_leftovers(before)

It checks, independently of the code under test:

- every row id the conversations had (tasks, steps, events, task links, rounds,
  participants, turns, turn links) is gone;
- no row anywhere has a missing parent (the foreign-keys-off bug's orphans),
  and no link, step output or lineage edge joins two owners;
- no artifact is left that nothing alive keeps (a live task link, step output
  or turn link, or being a source of a kept artifact);
- every artifact row's bytes are there and intact (in the configured store: a
  file in the blob folder or an object in the bucket), no blob is named by no
  artifact, no temp file is left, and no blob unlink is left pending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from django.db.models import F

from artifacts.models import Artifact, ArtifactSource, PendingUnlink
from artifacts.store import BlobStore, FolderStore, default_store
from council.models import CouncilRound, Participant, Turn, TurnArtifact
from notifications.models import Notice
from tasks.models import Conversation, Event, Step, Task, TaskArtifact


@dataclass
class Subtree:
    """Ids of every row under some conversations, taken before a delete."""

    conversations: set[int] = field(default_factory=set)
    tasks: set[int] = field(default_factory=set)
    steps: set[int] = field(default_factory=set)
    events: set[int] = field(default_factory=set)
    links: set[int] = field(default_factory=set)
    rounds: set[int] = field(default_factory=set)
    participants: set[int] = field(default_factory=set)
    turns: set[int] = field(default_factory=set)
    turn_links: set[int] = field(default_factory=set)
    notices: set[int] = field(default_factory=set)

    def __or__(self, other: Subtree) -> Subtree:
        return Subtree(
            **{
                name: getattr(self, name) | getattr(other, name)
                for name in self.__dataclass_fields__
            }
        )


MODELS = {
    "conversations": Conversation,
    "tasks": Task,
    "steps": Step,
    "events": Event,
    "links": TaskArtifact,
    "rounds": CouncilRound,
    "participants": Participant,
    "turns": Turn,
    "turn_links": TurnArtifact,
    "notices": Notice,
}


def _ids(qs) -> set[int]:
    return set(qs.values_list("pk", flat=True))


def subtree_snapshot(*conversation_ids: int) -> Subtree:
    ids = list(conversation_ids)
    return Subtree(
        conversations=_ids(Conversation.objects.filter(pk__in=ids)),
        tasks=_ids(Task.objects.filter(conversation_id__in=ids)),
        steps=_ids(Step.objects.filter(task__conversation_id__in=ids)),
        events=_ids(Event.objects.filter(task__conversation_id__in=ids)),
        links=_ids(TaskArtifact.objects.filter(task__conversation_id__in=ids)),
        rounds=_ids(CouncilRound.objects.filter(conversation_id__in=ids)),
        participants=_ids(Participant.objects.filter(round__conversation_id__in=ids)),
        turns=_ids(Turn.objects.filter(round__conversation_id__in=ids)),
        turn_links=_ids(
            TurnArtifact.objects.filter(turn__round__conversation_id__in=ids)
        ),
        notices=_ids(Notice.objects.filter(step__task__conversation_id__in=ids)),
    )


def _orphans() -> dict[str, int]:
    conversations = Conversation.objects.values("pk")
    tasks = Task.objects.values("pk")
    steps = Step.objects.values("pk")
    rounds = CouncilRound.objects.values("pk")
    participants = Participant.objects.values("pk")
    turns = Turn.objects.values("pk")
    artifacts = Artifact.objects.values("pk")
    checks = {
        "tasks without conversation": Task.objects.exclude(
            conversation_id__in=conversations
        ),
        "steps without task": Step.objects.exclude(task_id__in=tasks),
        "events without task": Event.objects.exclude(task_id__in=tasks),
        "events without step": Event.objects.filter(step__isnull=False).exclude(
            step_id__in=steps
        ),
        "task links without task": TaskArtifact.objects.exclude(task_id__in=tasks),
        "task links without step": TaskArtifact.objects.filter(
            step__isnull=False
        ).exclude(step_id__in=steps),
        "task links without artifact": TaskArtifact.objects.exclude(
            artifact_id__in=artifacts
        ),
        "step outputs without artifact": Step.objects.filter(
            output__isnull=False
        ).exclude(output_id__in=artifacts),
        "rounds without conversation": CouncilRound.objects.exclude(
            conversation_id__in=conversations
        ),
        "participants without round": Participant.objects.exclude(round_id__in=rounds),
        "turns without round": Turn.objects.exclude(round_id__in=rounds),
        "turns without participant": Turn.objects.exclude(
            participant_id__in=participants
        ),
        "turn links without turn": TurnArtifact.objects.exclude(turn_id__in=turns),
        "turn links without artifact": TurnArtifact.objects.exclude(
            artifact_id__in=artifacts
        ),
        "lineage edges without artifact": ArtifactSource.objects.exclude(
            artifact_id__in=artifacts
        ),
        "lineage edges without source": ArtifactSource.objects.exclude(
            source_id__in=artifacts
        ),
        # Rows are their owner's: nothing may join two owners.
        "task links to another owner's artifact": TaskArtifact.objects.exclude(
            artifact__owner_id=F("task__conversation__owner_id")
        ),
        "step outputs of another owner": Step.objects.filter(
            output__isnull=False
        ).exclude(output__owner_id=F("task__conversation__owner_id")),
        "turn links to another owner's artifact": TurnArtifact.objects.exclude(
            artifact__owner_id=F("turn__round__conversation__owner_id")
        ),
        "lineage edges between two owners": ArtifactSource.objects.exclude(
            source__owner_id=F("artifact__owner_id")
        ),
        "notices without step": Notice.objects.exclude(step_id__in=steps),
        "notices to someone other than the step's owner": Notice.objects.exclude(
            owner_id=F("step__task__conversation__owner_id")
        ),
    }
    return {label: qs.count() for label, qs in checks.items()}


def kept_artifact_ids() -> set[int]:
    """Artifacts something alive keeps, computed in Python from all rows."""
    live_conversations = _ids(Conversation.objects.all())
    live_tasks = set(
        Task.objects.filter(conversation_id__in=live_conversations).values_list(
            "pk", flat=True
        )
    )
    live_rounds = _ids(
        CouncilRound.objects.filter(conversation_id__in=live_conversations)
    )
    live_turns = _ids(Turn.objects.filter(round_id__in=live_rounds))
    roots = set(
        TaskArtifact.objects.filter(task_id__in=live_tasks).values_list(
            "artifact_id", flat=True
        )
    )
    roots |= set(
        Step.objects.filter(task_id__in=live_tasks, output__isnull=False).values_list(
            "output_id", flat=True
        )
    )
    roots |= set(
        TurnArtifact.objects.filter(turn_id__in=live_turns).values_list(
            "artifact_id", flat=True
        )
    )
    sources: dict[int, set[int]] = {}
    for derived, source in ArtifactSource.objects.values_list(
        "artifact_id", "source_id"
    ):
        sources.setdefault(derived, set()).add(source)
    kept, stack = set(), list(roots)
    while stack:
        pk = stack.pop()
        if pk in kept:
            continue
        kept.add(pk)
        stack.extend(sources.get(pk, ()))
    return kept


def _blob_problems(store: BlobStore) -> list[str]:
    """The store's listing against the rows: what is stored with no row, what
    a row names and is not there or fails its sha, what a write left."""
    problems = []
    rows = dict(Artifact.objects.values_list("sha256", "pk"))
    for path in store.iter_temp_files():
        problems.append(f"temp file left in the blob folder: {path.name}")
    stored = set(store.shas())
    for sha in sorted(stored - rows.keys()):
        problems.append(f"blob file with no artifact row: {sha}")
    states = store.states(list(rows), verify=True)
    for sha, pk in sorted(rows.items()):
        state = states.get(sha)
        if state is None:
            problems.append(f"artifact {pk} has no blob")
        elif not state[1]:
            problems.append(f"artifact {pk}'s blob fails its sha")
    return problems


def find_leftovers(
    subtree: Subtree | None = None, *, blob_dir: Path | str | None = None
) -> list[str]:
    """Return every leftover as a sentence; an empty list means clean."""
    problems = []
    if subtree is not None:
        for name, model in MODELS.items():
            ids = getattr(subtree, name)
            if ids:
                left = model.objects.filter(pk__in=ids).count()
                if left:
                    problems.append(f"{left} {name} of the deleted subtree remain")
    for label, count in _orphans().items():
        if count:
            problems.append(f"{count} {label}")
    unowned = _ids(Artifact.objects.all()) - kept_artifact_ids()
    if unowned:
        problems.append(f"artifacts nothing alive keeps: {sorted(unowned)}")
    pending = PendingUnlink.objects.count()
    if pending:
        problems.append(f"{pending} blob unlinks still pending")
    store = FolderStore(blob_dir) if blob_dir is not None else default_store()
    problems += _blob_problems(store)
    return problems


def assert_no_leftovers(
    subtree: Subtree | None = None, *, blob_dir: Path | str | None = None
) -> None:
    problems = find_leftovers(subtree, blob_dir=blob_dir)
    assert not problems, "leftovers after deletion:\n  " + "\n  ".join(problems)


def conversation_with_everything(*, owner, title: str = "Everything") -> tuple:
    """Build a conversation that touches every table deletion must clear.

    Return ``(conversation, artifacts)`` where ``artifacts`` maps a name to an
    Artifact: ``closes`` (fetched data), ``chart`` (rendered from closes),
    ``svg`` and ``png`` (a council widget and its preview, derived from it).
    Payloads are unique per call, so two calls never share an artifact.
    """
    import uuid

    from artifacts.models import ArtifactClass
    from artifacts.services import artifact_store
    from tasks.services import events_append

    tag = uuid.uuid4().hex
    conversation = Conversation.objects.create(owner=owner, title=title)
    closes = artifact_store(
        owner=owner,
        data=f"date,close\n2025-01-02,100 {tag}".encode(),
        media_type="text/csv",
        artifact_class=ArtifactClass.FETCH,
        title="daily closes",
    )
    chart = artifact_store(
        owner=owner,
        data=f"<svg>chart {tag}</svg>".encode(),
        media_type="image/svg+xml",
        artifact_class=ArtifactClass.RENDER,
        title="chart",
        source_ids=[closes.pk],
    )
    task = Task.objects.create(conversation=conversation, title="Chart the closes")
    fetch = Step.objects.create(
        task=task, position=1, title="fetch", tool="fetch", status="done", output=closes
    )
    render = Step.objects.create(
        task=task,
        position=2,
        title="render",
        tool="render",
        status="done",
        output=chart,
    )
    Step.objects.create(task=task, position=3, title="explain", tool="write")
    TaskArtifact.objects.create(task=task, step=fetch, artifact=closes)
    TaskArtifact.objects.create(task=task, step=render, artifact=chart)
    for step, artifact in ((fetch, closes), (render, chart)):
        events_append(
            task_id=task.pk,
            entries=[
                ("tool_call_started", step.pk, {}),
                ("payload_persisted", step.pk, {"sha256": artifact.sha256}),
                ("tool_result_persisted", step.pk, {"artifact": artifact.pk}),
            ],
        )
    council_round = CouncilRound.objects.create(
        conversation=conversation, number=1, topic="Is the chart right?"
    )
    claude = Participant.objects.create(round=council_round, name="claude")
    kimi = Participant.objects.create(round=council_round, name="kimi", position=1)
    svg = artifact_store(
        owner=owner,
        data=f"<svg>widget {tag}</svg>".encode(),
        media_type="image/svg+xml",
        artifact_class=ArtifactClass.RENDER,
        title="widget",
        source_ids=[chart.pk],
    )
    png = artifact_store(
        owner=owner,
        data=f"PNG preview {tag}".encode(),
        media_type="image/png",
        artifact_class=ArtifactClass.RENDER,
        title="widget preview",
        source_ids=[svg.pk],
    )
    first = Turn.objects.create(round=council_round, participant=claude, order=1)
    second = Turn.objects.create(round=council_round, participant=kimi, order=2)
    TurnArtifact.objects.create(turn=first, artifact=svg)
    TurnArtifact.objects.create(turn=first, artifact=png)
    TurnArtifact.objects.create(turn=second, artifact=chart, role="cited")
    return conversation, {"closes": closes, "chart": chart, "svg": svg, "png": png}
