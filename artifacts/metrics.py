"""What the blob store holds, read from the database at a scrape (``api.metrics``)."""

from __future__ import annotations

from django.db import connection
from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from artifacts.models import Artifact

# One blob per sha, whoever stores it: each sha counted once.
BLOBS_SQL = (
    "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM "
    f"(SELECT sha256, MAX(size) AS size FROM {Artifact._meta.db_table} "
    "GROUP BY sha256) AS blobs"
)


class StoreCollector:
    """The store's bytes and blobs, and the artifact rows over them."""

    def collect(self):
        with connection.cursor() as cursor:
            cursor.execute(BLOBS_SQL)
            blobs, stored = cursor.fetchone()
        yield GaugeMetricFamily(
            "pippa_blob_store_bytes",
            "Bytes of the blobs the rows name, each sha once.",
            value=float(stored),
        )
        yield GaugeMetricFamily(
            "pippa_blob_store_blobs",
            "Blobs the rows name (distinct shas).",
            value=float(blobs),
        )
        rows = GaugeMetricFamily(
            "pippa_artifacts",
            "Artifact rows, by their blob's integrity as last checked.",
            labels=["integrity"],
        )
        counts = (
            Artifact.objects.order_by().values_list("integrity").annotate(Count("pk"))
        )
        for integrity, count in counts:
            rows.add_metric([integrity], float(count))
        yield rows
