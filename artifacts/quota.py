"""A storage quota per user: the bytes of payloads the user's artifact rows name.

What counts (``artifacts.models.StorageQuota``): every row of the user's, at
its size, kept by the schema's triggers. Per row, not once per shared file:
bytes another owner also stored count for each of them, so a user's usage
never says anything about what someone else stores, and deleting one's own
rows frees exactly what they counted. Bytes the user already stored count
once (one row per owner and sha).

Where it is enforced, before any byte reaches the blob store:

- ``quota_check`` at a door that knows the size first (an upload's
  Content-Length, a form's file, MCP's content): refused at once.
- ``quota_admit`` given to the store as ``admit``: called once the bytes are
  hashed and before they are named, so a payload the owner already stored
  is never refused (it adds nothing) and a refused one leaves nothing.
- ``quota_enforce`` inside the transaction that inserts the row: the count
  the trigger just raised is read back and the insert refused (rolled back)
  if it went over. The trigger's update holds the owner's count row until
  the commit, so two writers racing past the checks before it cannot both
  get in. A payload written whose row was refused is named by nothing and
  goes through the pending-unlink record (``artifacts.services``).

A step whose output is refused is the executor's failure, not the tool's:
the output is unsaved, and the step waits for a person whatever its class
(``tasks.resume``: "quota_review"), who frees space or raises the quota and
retries it; no worker calls the tool again by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.template.defaultfilters import filesizeformat

from artifacts.models import Artifact, StorageQuota
from pippa_site.errors import PippaError

# The start of the refusal's words, and so of a step's "output unsaved" reason.
REASON_QUOTA = "storage quota reached"
ERR_QUOTA = (
    REASON_QUOTA + ": storing {need} more would use {after} of your {limit} "
    "(you use {used}); delete conversations you no longer need, or ask the "
    "operator for a larger quota"
)

T_QUOTA = f'"{StorageQuota._meta.db_table}"'


class QuotaExceeded(PippaError):
    """The owner's rows would name more bytes than their quota: 413."""

    status = 413
    code = "quota_exceeded"


def size_words(n: int) -> str:
    """Bytes as the pages show them (Django's ``filesizeformat``: 4.9 GB)."""
    return filesizeformat(n).replace("\xa0", " ")


@dataclass(frozen=True)
class Usage:
    """What a user stores and may store (``limit`` 0: no limit)."""

    used: int
    limit: int

    @property
    def limited(self) -> bool:
        return self.limit > 0

    @property
    def left(self) -> int | None:
        return max(self.limit - self.used, 0) if self.limited else None

    @property
    def percent(self) -> int | None:
        if not self.limited:
            return None
        return min(100, round(100 * self.used / self.limit))

    def refusal(self, need: int) -> QuotaExceeded:
        return QuotaExceeded(
            ERR_QUOTA.format(
                need=size_words(need),
                after=size_words(self.used + need),
                limit=size_words(self.limit),
                used=size_words(self.used),
            )
        )


def _limit(limit_bytes: int | None) -> int:
    return settings.PIPPA_QUOTA_BYTES if limit_bytes is None else limit_bytes


def quota_usage(*, owner_id: int) -> Usage:
    """The owner's bytes and limit, as the counters have them now."""
    row = (
        StorageQuota.objects.filter(owner_id=owner_id)
        .values_list("used_bytes", "limit_bytes")
        .first()
    )
    used, limit_bytes = row if row is not None else (0, None)
    return Usage(used=used, limit=_limit(limit_bytes))


def quota_check(*, owner_id: int, size: int, sha256: str | None = None) -> Usage:
    """Refuse (``QuotaExceeded``, with the quota and the usage in its words)
    if storing ``size`` more bytes would take the owner past their quota.

    Given the sha, bytes the owner already stored add nothing. One query.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT used_bytes, limit_bytes FROM {T_QUOTA} WHERE owner_id = %s",
            [owner_id],
        )
        row = cursor.fetchone()
    used, limit_bytes = row if row is not None else (0, None)
    usage = Usage(used=used, limit=_limit(limit_bytes))
    if not usage.limited or used + size <= usage.limit:
        return usage
    if (
        sha256 is not None
        and Artifact.objects.filter(owner_id=owner_id, sha256=sha256).exists()
    ):
        return usage  # already stored: one row per owner and sha
    raise usage.refusal(size)


def quota_admit(owner_id: int) -> Callable[[str, int], None]:
    """The store's ``admit`` for this owner: ``quota_check`` once the sha is known."""

    def admit(sha256: str, size: int) -> None:
        quota_check(owner_id=owner_id, size=size, sha256=sha256)

    return admit


def quota_enforce(cursor, *, owner_id: int, size: int) -> None:
    """In the transaction that just inserted the owner's row of ``size``
    bytes: refuse it if the count the trigger raised is past the quota."""
    cursor.execute(
        f"SELECT used_bytes, limit_bytes FROM {T_QUOTA} WHERE owner_id = %s",
        [owner_id],
    )
    row = cursor.fetchone()
    if row is None:
        return
    used, limit_bytes = row
    limit = _limit(limit_bytes)
    if limit > 0 and used > limit:
        raise Usage(used=used - size, limit=limit).refusal(size)
