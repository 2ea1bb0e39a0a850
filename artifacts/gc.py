"""Artifact garbage collection by lineage.

The rule (docs/design.md, "Deletion and the artifact rule"): an artifact
goes with the last live row that keeps it (a task's link, a step's output, a
council turn's link), unless a surviving artifact names it in
``source_refs``. What keeps an artifact is ``artifacts.keepers``: each app
registers its keeping tables there, and this module names none of them.

Its users:

- ``conversation_delete`` plans the GC for the artifacts one conversation
  reaches (``gc_plan``) and deletes them (``artifacts_delete``), all inside
  its locked transaction. Only candidates reachable from that conversation are
  examined, never the whole table.
- The doctor sweeps everything nothing alive keeps (``unowned_artifacts``),
  whatever older code or a crash left behind.
- The admin deletes artifacts by hand only when nothing keeps them
  (``artifacts_delete_unkept``).

Blob files go only after the commit (``transaction.on_commit``); the shas
are first written to ``PendingUnlink`` in the same transaction, so a crash
between the commit and the unlink is finished by the next delete, worker
start or doctor run (``pending_unlinks_finish``). A rollback leaves every
file in place, and a failed unlink is logged, not raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from artifacts.keepers import Keeper, keepers, kept_by
from artifacts.models import Artifact, ArtifactSource, PendingUnlink
from artifacts.store import BlobStore, default_store
from pippa_site.errors import Conflict

logger = logging.getLogger("pippa.gc")

# Ids per IN list: far under SQLite's variable limit (32,766 since 3.32, 999
# before) and PostgreSQL's 65,535 parameters, and small enough for the planner.
BATCH = 500

# Named by title (Dad knows his tasks by name, not by number).
REASON_SOURCE = "named as a source by artifact {artifact}"
# When a keeper has no words of its own for a parent.
REASON_KEPT = "kept by {noun} {parent}"


def blob_guard(sha: str) -> None:
    """Serialise "create a row for this blob" with "unlink this unnamed blob".

    Call inside a transaction. SQLite's IMMEDIATE transactions already hold
    the database's write lock; PostgreSQL takes a transaction-scoped advisory
    lock keyed by the sha.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [blob_guard_key(sha)])


def blob_guard_key(sha: str) -> int:
    """The advisory lock's key for a sha (PostgreSQL), for ``blob_guard`` and
    the executor's artifact INSERT that takes the same lock in its FROM."""
    return int(sha[:15], 16)


@dataclass(frozen=True)
class ArtifactRecord:
    """A small, printable record of an artifact that was (or would be) removed or kept."""

    id: int
    sha256: str
    title: str
    artifact_class: int
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "sha256": self.sha256,
            "title": self.title,
            "artifact_class": self.artifact_class,
            "reason": self.reason,
        }


@dataclass
class GcPlan:
    """What the artifact rule decides for a set of candidates."""

    remove: list[ArtifactRecord] = field(default_factory=list)
    keep: list[ArtifactRecord] = field(default_factory=list)


def batched(ids: Iterable[int], size: int = BATCH) -> Iterator[list[int]]:
    chunk: list[int] = []
    for pk in ids:
        chunk.append(pk)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _lineage_closure(start: set[int]) -> set[int]:
    """Return ``start`` plus every artifact reachable through ``source_refs``."""
    seen = set(start)
    frontier = sorted(start)
    while frontier:
        found: set[int] = set()
        for chunk in batched(frontier):
            found.update(
                ArtifactSource.objects.filter(artifact_id__in=chunk).values_list(
                    "source_id", flat=True
                )
            )
        frontier = sorted(found - seen)
        seen.update(frontier)
    return seen


def _outside_keepers(
    ids: Sequence[int], leaving_conversation_id: int | None
) -> dict[int, str]:
    """Return {artifact id: reason} for candidates a row outside the leaving
    conversation keeps (any registered keeper: a task link, a step output, a
    council turn link; the first keeper found gives the reason).

    A row whose parent is already gone (the old foreign-keys-off bug) still
    keeps the artifact: the database would refuse the delete anyway, and the
    doctor is the one to clear such rows (its keeper says so in words).
    """
    found: dict[int, tuple[Keeper, int]] = {}
    for keeper in keepers():
        rows = keeper.rows()
        if leaving_conversation_id is not None:
            rows = rows.exclude(**{keeper.conversation_id: leaving_conversation_id})
        for chunk in batched(ids):
            matched = rows.filter(**{f"{keeper.artifact_id}__in": chunk})
            for artifact_id, parent_id in matched.values_list(
                keeper.artifact_id, keeper.parent_id
            ):
                found.setdefault(artifact_id, (keeper, parent_id))
    reasons: dict[int, str] = {}
    for keeper in keepers():
        parents = sorted({p for k, p in found.values() if k is keeper})
        words: dict[int, str] = {}
        for chunk in batched(parents):
            words.update(keeper.shared(chunk))
        for artifact_id, (k, parent_id) in found.items():
            if k is keeper:
                reasons[artifact_id] = words.get(
                    parent_id, REASON_KEPT.format(noun=keeper.noun, parent=parent_id)
                )
    return reasons


def _records(ids: Iterable[int]) -> dict[int, ArtifactRecord]:
    records = {}
    for chunk in batched(sorted(ids)):
        for pk, sha, title, cls in Artifact.objects.filter(pk__in=chunk).values_list(
            "pk", "sha256", "title", "artifact_class"
        ):
            records[pk] = ArtifactRecord(pk, sha, title, cls)
    return records


def gc_plan(
    *,
    candidate_ids: Iterable[int],
    leaving_conversation_id: int | None = None,
    lock: bool = False,
) -> GcPlan:
    """Decide which candidates go and which stay (with why), without writing.

    1. Close the candidates under lineage: the sources of a candidate may lose
       their last keeper when it goes.
    2. Keep every candidate that a ref from outside the leaving conversation
       points at (task link, step output, turn link).
    3. Of the rest, keep any that a surviving artifact names as a source; that
       survivor may itself be a candidate that was just kept, so repeat until
       nothing changes (the fixed point). Everything left goes.

    With ``lock`` (inside ``conversation_delete``) the candidate rows are
    locked first on PostgreSQL (``SELECT … FOR UPDATE``), so a concurrent
    writer cannot link one between the check and the delete; SQLite already
    holds the database's write lock.
    """
    considered = _lineage_closure(set(candidate_ids))
    if not considered:
        return GcPlan()
    ordered = sorted(considered)
    if lock and connection.features.has_select_for_update:
        for chunk in batched(ordered):
            list(
                Artifact.objects.select_for_update()
                .filter(pk__in=chunk)
                .values_list("pk", flat=True)
            )
    reasons = _outside_keepers(ordered, leaving_conversation_id)

    # (source, derived) lineage edges into the considered set.
    namers: dict[int, list[int]] = {}
    for chunk in batched(ordered):
        for source_id, artifact_id in ArtifactSource.objects.filter(
            source_id__in=chunk
        ).values_list("source_id", "artifact_id"):
            namers.setdefault(source_id, []).append(artifact_id)

    doomed = considered - reasons.keys()
    changed = True
    while changed:
        changed = False
        for pk in sorted(doomed):
            survivors = [a for a in namers.get(pk, ()) if a not in doomed]
            if survivors:
                doomed.discard(pk)
                reasons[pk] = REASON_SOURCE.format(artifact=min(survivors))
                changed = True

    records = _records(considered)
    plan = GcPlan()
    for pk in ordered:
        if pk not in records:  # vanished meanwhile (preview only; delete locks)
            continue
        if pk in doomed:
            plan.remove.append(records[pk])
        else:
            record = records[pk]
            plan.keep.append(
                ArtifactRecord(
                    record.id,
                    record.sha256,
                    record.title,
                    record.artifact_class,
                    reasons[pk],
                )
            )
    return plan


def artifacts_delete(
    *, records: Sequence[ArtifactRecord], store: BlobStore | None = None
) -> int:
    """Delete artifact rows by id (lineage edges go by the schema's cascade)
    and unlink their blobs after the surrounding transaction commits.

    The caller has decided that nothing keeps these rows; the refs to artifacts
    are NO ACTION in the schema, so a wrong decision fails at commit instead of
    leaving a dangling ref. Return the number of rows deleted.
    """
    if not records:
        blobs_unlink_after_commit(shas=[], store=store)
        return 0
    table = connection.ops.quote_name(Artifact._meta.db_table)
    deleted = 0
    with connection.cursor() as cursor:
        for chunk in batched([r.id for r in records]):
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(f"DELETE FROM {table} WHERE id IN ({marks})", chunk)
            deleted += cursor.rowcount
    blobs_unlink_after_commit(shas=[r.sha256 for r in records], store=store)
    return deleted


class ArtifactKept(Conflict):
    """An artifact something alive keeps cannot be deleted by hand."""


ERR_KEPT = "Artifact {id} cannot be deleted: it is kept — {reasons}."


def kept_refusals(*, artifacts: Sequence[Artifact], plan: GcPlan) -> list[str]:
    """Say, for each artifact the plan keeps, what keeps it (empty: none is kept)."""
    kept = {r.id: r.reason for r in plan.keep}
    return [
        ERR_KEPT.format(id=a.pk, reasons="; ".join(artifact_kept_by(a) or [kept[a.pk]]))
        for a in artifacts
        if a.pk in kept
    ]


def artifact_kept_by(artifact: Artifact) -> list[str]:
    """Say, in plain words, what alive keeps this artifact (empty: nothing)."""
    derived = ArtifactSource.objects.filter(source=artifact).values_list(
        "artifact_id", flat=True
    )
    return [
        *kept_by(artifact),
        *(f"named as a source by artifact {d}" for d in derived[:20]),
    ]


@transaction.atomic
def artifacts_delete_unkept(*, artifacts: Sequence[Artifact]) -> GcPlan:
    """Delete artifacts nothing alive keeps: rows now, blobs after the commit.

    The plan is made under lock (a link may have appeared since a person saw
    the confirmation page); a kept artifact refuses the whole delete
    (``ArtifactKept``, naming what keeps each). Sources only these kept go
    with them, as the rule says.
    """
    plan = gc_plan(candidate_ids=[a.pk for a in artifacts], lock=True)
    refusals = kept_refusals(artifacts=artifacts, plan=plan)
    if refusals:
        raise ArtifactKept(" ".join(refusals))
    artifacts_delete(records=plan.remove)
    return plan


def blobs_unlink_after_commit(
    *, shas: Sequence[str], store: BlobStore | None = None
) -> None:
    """Record these blobs as pending in the caller's transaction; unlink after commit.

    The record (``PendingUnlink``) commits with the delete that freed the
    blobs, so a process killed between the commit and the unlink leaves the
    shas written down: ``pending_unlinks_finish`` (the next delete, a worker
    starting, the doctor) unlinks them at once. A rollback takes the record
    with it and leaves every file.
    """
    shas = sorted(set(shas))
    now = timezone.now()
    for chunk in batched(shas):
        PendingUnlink.objects.bulk_create(
            [PendingUnlink(sha256=sha, created_at=now) for sha in chunk],
            ignore_conflicts=True,
        )
    # Every pending record, not only these: what an earlier killed delete
    # left is finished by the next one.
    transaction.on_commit(lambda: pending_unlinks_finish(store=store))


def pending_unlinks_finish(
    *, store: BlobStore | None = None, shas: Sequence[str] | None = None
) -> int:
    """Unlink every pending blob (or these) that no row names; clear the record.

    Each chunk is one short transaction under the per-sha guard: a row
    created for the same bytes meanwhile keeps its blob, and its pending
    record goes all the same. Return the number of files removed.
    """
    store = store or default_store()
    pending = PendingUnlink.objects.order_by("sha256")
    if shas is not None:
        pending = pending.filter(sha256__in=list(shas))
    removed = 0
    for chunk in batched(list(pending.values_list("sha256", flat=True))):
        removed += blobs_unlink(shas=chunk, store=store, done=True)
    return removed


def blobs_unlink(
    *,
    shas: Sequence[str],
    store: BlobStore,
    on_error: Callable | None = None,
    done: bool = False,
) -> int:
    """Unlink the blobs of these shas that no artifact row names (re-checked
    here: the same bytes may have been stored again since). Failures are
    logged and skipped; the doctor sweeps what is left. With ``done`` the
    shas' pending-unlink records go in the same guarded transaction. Return
    the count removed.
    """
    removed = 0
    for chunk in batched(list(shas)):
        # Under blob_guard, as artifact_record is: a row created for the same
        # bytes either commits before this check (blob kept) or finds the
        # blob gone and writes it again.
        with transaction.atomic():
            for sha in sorted(chunk):  # one lock order: no deadlock between GCs
                blob_guard(sha)
            named = set(
                Artifact.objects.filter(sha256__in=chunk).values_list(
                    "sha256", flat=True
                )
            )
            failed = set()
            for sha in chunk:
                if sha in named:
                    continue
                try:
                    if store.unlink(sha):
                        removed += 1
                except OSError as exc:
                    failed.add(sha)
                    logger.warning("could not unlink blob %s: %s", sha, exc)
                    if on_error:
                        on_error(sha, exc)
            if done:
                finished = [sha for sha in chunk if sha not in failed]
                PendingUnlink.objects.filter(sha256__in=finished).delete()
    return removed


def unowned_artifacts(*, created_before: datetime) -> list[tuple[int, str]]:
    """Return (id, sha256) of every artifact nothing alive keeps, oldest first.

    Alive keepers: rows of a registered keeper (``artifacts.keepers``: a task
    link, step output or turn link) whose chain up to its conversation is
    intact. Kept artifacts keep their sources (recursively).
    Artifacts created after ``created_before`` count as kept: a writer may be
    between storing the artifact and linking it.
    """
    q = connection.ops.quote_name
    a = q(Artifact._meta.db_table)
    src = q(ArtifactSource._meta.db_table)
    # Each keeper's rows whose chain up to their conversation is intact.
    alive, alive_params = [], []
    for keeper in keepers():
        sql, params = (
            keeper.alive().values_list(keeper.artifact_id).query.sql_with_params()
        )
        alive.append(sql)
        alive_params.extend(params)
    keeper_rows = "\n            UNION\n            ".join(alive)
    sql = f"""
        WITH RECURSIVE kept(id) AS (
            SELECT x.id FROM {a} x WHERE x.created_at >= %s
            UNION
            {keeper_rows}
            UNION
            SELECT e.source_id FROM {src} e JOIN kept k ON e.artifact_id = k.id
        )
        SELECT y.id, y.sha256 FROM {a} y
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = y.id)
         ORDER BY y.id
    """
    cutoff = connection.ops.adapt_datetimefield_value(created_before)
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, [cutoff, *alive_params])
            return [(row[0], row[1]) for row in cursor.fetchall()]
    # PostgreSQL guesses millions of rows for the recursive CTE and then spends
    # seconds JIT-compiling a query that runs in milliseconds.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, [cutoff, *alive_params])
        return [(row[0], row[1]) for row in cursor.fetchall()]


def unowned_artifacts_delete(
    *,
    created_before: datetime,
    store: BlobStore | None = None,
    only: Iterable[int] | None = None,
) -> list[tuple[int, str]]:
    """Delete every artifact nothing alive keeps (of ``only``, if given); blobs
    go after the commit.

    The unowned set is closed under "names as a source" (a kept artifact keeps
    its sources), and so is its intersection with an earlier unowned set
    (``only``: what the doctor's check found), so deleting it in one
    transaction satisfies the schema's NO ACTION refs. Return the (id, sha256)
    pairs deleted.
    """
    allowed = set(only) if only is not None else None
    with transaction.atomic():
        rows = _unowned_within(created_before, allowed)
        if connection.features.has_select_for_update and rows:
            for chunk in batched([pk for pk, _ in rows]):
                list(
                    Artifact.objects.select_for_update()
                    .filter(pk__in=chunk)
                    .values_list("pk", flat=True)
                )
            rows = _unowned_within(created_before, allowed)
        artifacts_delete(
            records=[ArtifactRecord(pk, sha, "", 0) for pk, sha in rows], store=store
        )
    return rows


def _unowned_within(
    created_before: datetime, allowed: set[int] | None
) -> list[tuple[int, str]]:
    """The unowned artifacts, limited to ``allowed``; a source that a survivor
    outside the set still names stays (the schema would refuse its delete)."""
    rows = unowned_artifacts(created_before=created_before)
    if allowed is None:
        return rows
    doomed = {pk: sha for pk, sha in rows if pk in allowed}
    changed = True
    while changed and doomed:
        changed = False
        for chunk in batched(sorted(doomed)):
            named = (
                ArtifactSource.objects.filter(source_id__in=chunk)
                .exclude(artifact_id__in=list(doomed))
                .values_list("source_id", flat=True)
            )
            for pk in set(named):
                doomed.pop(pk, None)
                changed = True
    return sorted(doomed.items())
