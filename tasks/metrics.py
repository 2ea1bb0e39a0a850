"""Tasks and steps as the database has them at a scrape (``api.metrics``)."""

from __future__ import annotations

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from tasks.models import Step, Task


class TaskCollector:
    """Tasks by status, the queue a worker would take now, steps by status."""

    def collect(self):
        tasks = GaugeMetricFamily("pippa_tasks", "Tasks by status.", labels=["status"])
        found = dict(
            Task.objects.order_by().values_list("status").annotate(Count("pk"))
        )
        for status in Task.Status.values:
            tasks.add_metric([status], float(found.get(status, 0)))
        yield tasks
        yield GaugeMetricFamily(
            "pippa_queue_depth",
            "Tasks a worker may step now (queued, or running with a dead lease, "
            "and not waiting out a retry's back-off).",
            value=float(Task.objects.runnable().count()),
        )
        steps = GaugeMetricFamily(
            "pippa_steps_waiting",
            "Steps waiting for a person (needs_review) or failed for good.",
            labels=["status"],
        )
        waiting = dict(
            Step.objects.filter(
                status__in=[Step.Status.NEEDS_REVIEW, Step.Status.FAILED]
            )
            .order_by()
            .values_list("status")
            .annotate(Count("pk"))
        )
        for status in (Step.Status.NEEDS_REVIEW, Step.Status.FAILED):
            steps.add_metric([status], float(waiting.get(status, 0)))
        yield steps
