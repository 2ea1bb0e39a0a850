"""The outbox as the database has it at a scrape (``api.metrics``)."""

from __future__ import annotations

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from notifications.models import Notice


class OutboxCollector:
    """Notices by state: waiting to be sent (pending), sent, dropped."""

    def collect(self):
        notices = GaugeMetricFamily(
            "pippa_notices", "Notices in the outbox, by state.", labels=["state"]
        )
        found = dict(
            Notice.objects.order_by().values_list("state").annotate(Count("pk"))
        )
        for state in Notice.State.values:
            notices.add_metric([state], float(found.get(state, 0)))
        yield notices
