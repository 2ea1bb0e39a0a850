from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Length
from django.db.models.lookups import Exact
from django.urls import reverse

from pippa_site.owners import OwnedQuerySet
from pippa_site.text import TITLE_MAX


class ArtifactClass(models.IntegerChoices):
    """How a step's output behaves on resume (docs/design.md, "Four artifact classes")."""

    FILE = 1, "file"  # externally persisted: reuse if present and intact
    FETCH = 2, "fetch"  # idempotent fetch: safe to fetch again
    SNAPSHOT = 3, "snapshot"  # non-deterministic: never re-run once persisted
    RENDER = 4, "render"  # derived render-out: re-render only from live sources


class Integrity(models.TextChoices):
    UNCHECKED = "unchecked", "not checked yet"
    OK = "ok", "intact"
    MISSING = "missing", "blob missing"
    CORRUPT = "corrupt", "blob fails its sha"


class ArtifactQuerySet(OwnedQuerySet):
    pass


class Artifact(models.Model):
    """An owner's row over a blob: metadata and a sha256 ref.

    The blob store is global and deduplicated; the row is not. Two owners who
    store the same bytes get two rows over one blob, and the title, media
    type, class, meta, integrity and lineage of each belong to its owner
    alone (docs/ownership.md).
    """

    Integrity = Integrity

    # NO ACTION at the database: a user's rows leave through the GC when the
    # user's conversations are deleted (tasks.signals), never by a cascade.
    # No index of its own: the unique (owner, sha256) index leads with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        related_name="artifacts",
        db_index=False,
    )
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    media_type = models.CharField(max_length=255, default="application/octet-stream")
    artifact_class = models.PositiveSmallIntegerField(
        choices=ArtifactClass, default=ArtifactClass.SNAPSHOT
    )
    title = models.CharField(max_length=TITLE_MAX, blank=True)
    # Small metadata only (origin path, dimensions, preview status); never payload.
    meta = models.JSONField(default=dict, blank=True)
    integrity = models.CharField(
        max_length=16, choices=Integrity, default=Integrity.UNCHECKED
    )
    verified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sources = models.ManyToManyField(
        "self",
        through="ArtifactSource",
        through_fields=("artifact", "source"),
        symmetrical=False,
        related_name="derived",
        blank=True,
    )

    objects = ArtifactQuerySet.as_manager()

    class Meta:
        constraints = [
            # "These bytes are already stored for this owner": one row per
            # owner and sha (artifact_insert's ON CONFLICT target).
            models.UniqueConstraint(
                fields=["owner", "sha256"], name="artifacts_artifact_owner_sha_uniq"
            ),
            # The blob store refuses anything else; the row must agree.
            models.CheckConstraint(
                condition=Exact(Length("sha256"), 64),
                name="artifacts_artifact_sha256_len",
            ),
            models.CheckConstraint(
                condition=Q(artifact_class__in=ArtifactClass.values),
                name="artifacts_artifact_class_valid",
            ),
            models.CheckConstraint(
                condition=Q(integrity__in=Integrity.values),
                name="artifacts_artifact_integrity_valid",
            ),
            models.CheckConstraint(
                condition=Q(size__gte=0), name="artifacts_artifact_size_nonneg"
            ),
        ]
        indexes = [
            # Blob GC and the doctor: does a row of any owner still name this sha?
            models.Index(fields=["sha256"], name="artifacts_artifact_sha256"),
            # Admin and doctor filters: damaged artifacts.
            models.Index(
                fields=["integrity"],
                name="artifacts_artifact_damaged",
                condition=Q(integrity__in=["missing", "corrupt"]),
            ),
            models.Index(fields=["artifact_class"], name="artifacts_artifact_class"),
        ]

    def __str__(self) -> str:
        return self.title or f"{self.media_type} {self.sha256[:12]}"

    def get_absolute_url(self) -> str:
        return reverse("artifacts:detail", args=[self.pk])

    @property
    def class_label(self) -> str:
        return ArtifactClass(self.artifact_class).label


class ArtifactSource(models.Model):
    """Lineage: ``artifact`` was derived from ``source``.

    Deleting the derived artifact removes its edges in the database; deleting a
    source that a surviving artifact still names is refused by the foreign key
    (NO ACTION), which backs the GC rule "kept while named in source_refs".
    """

    artifact = models.ForeignKey(
        Artifact, on_delete=models.DB_CASCADE, related_name="source_links"
    )
    source = models.ForeignKey(
        Artifact, on_delete=models.DO_NOTHING, related_name="derived_links"
    )
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["artifact", "source"], name="artifacts_source_uniq"
            ),
            models.CheckConstraint(
                condition=~Q(artifact=F("source")), name="artifacts_source_not_self"
            ),
        ]
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return f"{self.artifact_id} <- {self.source_id}"


class PendingUnlink(models.Model):
    """A blob file that a committed delete (or a failed write) still has to unlink.

    Written in the same transaction as the delete, so a crash after the commit
    leaves the shas here rather than forgotten: the next delete, the next
    worker start or the doctor finishes them at once, under the per-sha guard,
    unlinking only blobs that no artifact row of any owner names.
    """

    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One row per blob: a second delete of the same bytes adds nothing.
            models.UniqueConstraint(
                fields=["sha256"], name="artifacts_pendingunlink_sha_uniq"
            ),
            models.CheckConstraint(
                condition=Exact(Length("sha256"), 64),
                name="artifacts_pendingunlink_sha256_len",
            ),
        ]

    def __str__(self) -> str:
        return f"unlink {self.sha256[:12]}"


class StorageQuota(models.Model):
    """A user's stored bytes, and the most they may store (``artifacts.quota``).

    ``used_bytes`` is the sum of the sizes of the user's artifact rows, kept
    by the schema itself: triggers on the artifact table add a row's size
    when it is inserted and take it off when it is deleted, whichever path
    does it (a step's commit, an upload, the GC, the doctor, a user's
    delete). Counted per row: bytes another owner also stored count for
    each of them, so what one user sees never depends on what others store
    (the shared file is a saving of the site's, not a hint about someone
    else's data), and deleting one's own rows always frees what they count.

    ``limit_bytes``: this user's own limit, set by staff; empty means the
    site's ``PIPPA_QUOTA_BYTES``; 0 means no limit.
    """

    owner = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        primary_key=True,
        on_delete=models.DB_CASCADE,
        related_name="storage_quota",
    )
    used_bytes = models.BigIntegerField(default=0)
    limit_bytes = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Bytes this user may store; empty: the site's default "
        "(PIPPA_QUOTA_BYTES); 0: no limit.",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(limit_bytes__isnull=True) | Q(limit_bytes__gte=0),
                name="artifacts_storagequota_limit_nonneg",
            ),
        ]

    def __str__(self) -> str:
        return f"storage of user {self.owner_id}"
