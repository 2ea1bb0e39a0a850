"""Artifact rows belong to an owner: split every shared row per owner.

Before this migration one row per sha was shared by every user who stored the
same bytes, and its title, class, media type and lineage were whoever wrote
first. After it, each owner who reaches a row (through a task link, a step
output or a council turn link of one of their conversations, or as a lineage
source of a row they reach) has a row of their own over the same blob:

1. 0003 added ``owner`` (nullable for now) and took away the global
   uniqueness of ``sha256`` (the blob store stays deduplicated; rows do not).
2. The owner with the smallest user id keeps the existing row (and its id);
   every other owner gets a copy, and their links, step outputs and turn
   links are moved onto it.
3. Lineage is rebuilt per owner: an owner's row names that owner's rows,
   and an edge whose source only other owners reach directly is dropped
   (a preview shared by two users' look-alike widgets named both).
   ``meta`` refs to other rows (a widget's ``preview.artifact_id``, a
   preview's ``preview_of``) are remapped to the owner's own rows, or dropped
   when the owner has none (the preview is then rendered again on demand).
4. Where an owner's step produced the bytes, the row takes its title and
   media type from that step's own ``payload_persisted`` event and its class
   from the step, not from whoever stored the bytes first.
5. Rows that no owner reaches are what ``pippa_doctor --repair`` deletes
   anyway; they are deleted here (their blobs stay for the doctor's sweep).

0005 then makes ``owner`` required and ``(owner, sha256)`` unique. The three
steps are separate migrations so that PostgreSQL never alters the table (nor
builds the index Django defers to the end of a migration) while rows written
here still have deferred foreign-key checks pending.
"""

from collections import defaultdict

from django.db import migrations


def _reach(apps):
    """Return ({artifact id: owner ids}, {(artifact id, owner): [(source, position)]}).

    An owner reaches a row directly through a task link, a step output or a
    turn link of one of their conversations, and reaches the sources of the
    rows they reach. A lineage edge counts for an owner unless its source is
    reached directly only by other owners: a preview row shared by two
    users' look-alike widgets named both widgets as sources, and neither
    user's copy may name the other's widget.
    """
    ArtifactSource = apps.get_model("artifacts", "ArtifactSource")
    TaskArtifact = apps.get_model("tasks", "TaskArtifact")
    Step = apps.get_model("tasks", "Step")
    TurnArtifact = apps.get_model("council", "TurnArtifact")

    direct = defaultdict(set)
    for aid, owner in TaskArtifact.objects.values_list(
        "artifact_id", "task__conversation__owner_id"
    ):
        direct[aid].add(owner)
    for aid, owner in Step.objects.filter(output__isnull=False).values_list(
        "output_id", "task__conversation__owner_id"
    ):
        direct[aid].add(owner)
    for aid, owner in TurnArtifact.objects.values_list(
        "artifact_id", "turn__round__conversation__owner_id"
    ):
        direct[aid].add(owner)
    sources = defaultdict(list)
    for aid, sid, position in ArtifactSource.objects.order_by(
        "position", "id"
    ).values_list("artifact_id", "source_id", "position"):
        sources[aid].append((sid, position))

    reach = defaultdict(set)
    edges = defaultdict(list)
    stack = [(aid, owner) for aid, owners in direct.items() for owner in owners]
    for aid, owner in stack:
        reach[aid].add(owner)
    while stack:
        aid, owner = stack.pop()
        for sid, position in sources.get(aid, ()):
            if direct.get(sid) and owner not in direct[sid]:
                continue  # another owner's edge
            edges[(aid, owner)].append((sid, position))
            if owner not in reach[sid]:
                reach[sid].add(owner)
                stack.append((sid, owner))
    return reach, edges


def _remap_meta(meta, owner, row_for):
    meta = dict(meta or {})
    preview = meta.get("preview")
    if isinstance(preview, dict) and preview.get("artifact_id") is not None:
        mine = row_for.get((preview["artifact_id"], owner))
        if mine is None:
            meta.pop("preview")
        else:
            meta["preview"] = {**preview, "artifact_id": mine}
    if meta.get("preview_of") is not None:
        mine = row_for.get((meta["preview_of"], owner))
        if mine is None:
            meta.pop("preview_of")
        else:
            meta["preview_of"] = mine
    return meta


def _own_step_writes(apps):
    """Return {(artifact id, owner): (title, media type, class)} from steps."""
    Event = apps.get_model("tasks", "Event")
    Step = apps.get_model("tasks", "Step")
    found = {}
    steps = Step.objects.filter(output__isnull=False).values_list(
        "pk", "output_id", "output__sha256", "artifact_class", "task__conversation__owner_id"
    )
    for step_id, aid, sha, cls, owner in steps.order_by("pk"):
        if (aid, owner) in found:
            continue
        events = Event.objects.filter(step_id=step_id, kind="payload_persisted")
        for data in events.order_by("-seq").values_list("data", flat=True):
            if isinstance(data, dict) and data.get("sha") == sha:
                found[(aid, owner)] = (
                    str(data.get("title") or "")[:300],
                    str(data.get("media_type") or "")[:255],
                    cls,
                )
                break
    return found


def split_rows_per_owner(apps, schema_editor):
    Artifact = apps.get_model("artifacts", "Artifact")
    ArtifactSource = apps.get_model("artifacts", "ArtifactSource")
    TaskArtifact = apps.get_model("tasks", "TaskArtifact")
    Step = apps.get_model("tasks", "Step")
    TurnArtifact = apps.get_model("council", "TurnArtifact")

    reach, edges = _reach(apps)
    own_writes = _own_step_writes(apps)

    # Lineage is rebuilt below from ``edges``, per owner.
    ArtifactSource.objects.all().delete()
    unreached = list(
        Artifact.objects.exclude(pk__in=list(reach)).values_list("pk", flat=True)
    )
    for i in range(0, len(unreached), 500):
        Artifact.objects.filter(pk__in=unreached[i : i + 500]).delete()

    row_for = {}  # (original id, owner) -> the owner's row id
    for artifact in Artifact.objects.filter(pk__in=list(reach)).order_by("pk"):
        owners = sorted(reach[artifact.pk])
        first, others = owners[0], owners[1:]
        Artifact.objects.filter(pk=artifact.pk).update(owner_id=first)
        row_for[(artifact.pk, first)] = artifact.pk
        for owner in others:
            copy = Artifact.objects.create(
                owner_id=owner,
                sha256=artifact.sha256,
                size=artifact.size,
                media_type=artifact.media_type,
                artifact_class=artifact.artifact_class,
                title=artifact.title,
                meta=artifact.meta,
                integrity=artifact.integrity,
                verified_at=artifact.verified_at,
            )
            # auto_now_add gave the copy today's date; keep the original's.
            Artifact.objects.filter(pk=copy.pk).update(created_at=artifact.created_at)
            row_for[(artifact.pk, owner)] = copy.pk

    # Move each owner's refs onto the owner's row.
    for link in TaskArtifact.objects.values_list(
        "pk", "artifact_id", "task__conversation__owner_id"
    ):
        pk, aid, owner = link
        if row_for[(aid, owner)] != aid:
            TaskArtifact.objects.filter(pk=pk).update(artifact_id=row_for[(aid, owner)])
    for pk, aid, owner in Step.objects.filter(output__isnull=False).values_list(
        "pk", "output_id", "task__conversation__owner_id"
    ):
        if row_for[(aid, owner)] != aid:
            Step.objects.filter(pk=pk).update(output_id=row_for[(aid, owner)])
    for pk, aid, owner in TurnArtifact.objects.values_list(
        "pk", "artifact_id", "turn__round__conversation__owner_id"
    ):
        if row_for[(aid, owner)] != aid:
            TurnArtifact.objects.filter(pk=pk).update(artifact_id=row_for[(aid, owner)])

    # Lineage per owner: every row gets exactly its owner's edges, between
    # the owner's own rows.
    ArtifactSource.objects.bulk_create(
        [
            ArtifactSource(
                artifact_id=mine, source_id=row_for[(sid, owner)], position=position
            )
            for (aid, owner), mine in row_for.items()
            for sid, position in edges.get((aid, owner), ())
        ],
        batch_size=500,
    )

    # Each row's meta refs and, where the owner's own step wrote the bytes,
    # its title, media type and class.
    for (aid, owner), mine in row_for.items():
        artifact = Artifact.objects.get(pk=mine)
        fields = {"meta": _remap_meta(artifact.meta, owner, row_for)}
        if (aid, owner) in own_writes:
            title, media_type, cls = own_writes[(aid, owner)]
            fields.update(title=title, artifact_class=cls)
            if media_type:
                fields["media_type"] = media_type
        Artifact.objects.filter(pk=mine).update(**fields)


class Migration(migrations.Migration):

    dependencies = [
        ("artifacts", "0003_artifact_owner"),
        ("tasks", "0002_event_calls_started_index"),
        ("council", "0002_turnartifact_context_role"),
    ]

    operations = [
        migrations.RunPython(split_rows_per_owner, migrations.RunPython.noop),
    ]
