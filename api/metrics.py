"""``GET /metrics``: the Prometheus text of this host, for staff or a scrape token.

What a scrape reads: every process of this host's counters and histograms
(``pippa_site.metrics``, prometheus-client's multiprocess files) and, read
from the database at that moment, the tasks, the queue, the outbox and the
blob store (each app's collector). ``docs/metrics.md`` lists the families
and when to worry.

Who may read it: a signed-in staff user, or a scraper that sends
``Authorization: Bearer <PIPPA_METRICS_TOKEN>``; anyone else gets 403 (the
figures say how busy the site is and how much it stores, which is not every
user's business). With no token set, only staff may read it.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from artifacts.metrics import StoreCollector
from notifications.metrics import OutboxCollector
from pippa_site import metrics
from tasks.metrics import TaskCollector

ERR_FORBIDDEN = (
    "metrics are for staff, or a scraper sending "
    "Authorization: Bearer <PIPPA_METRICS_TOKEN>\n"
)


def scrape_allowed(request: HttpRequest) -> bool:
    """Staff signed in, or the scrape token (compared in constant time)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    return metrics.token_matches(
        request.headers.get("Authorization", ""), settings.PIPPA_METRICS_TOKEN
    )


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not scrape_allowed(request):
        return HttpResponseForbidden(
            ERR_FORBIDDEN, content_type="text/plain; charset=utf-8"
        )
    body, content_type = metrics.exposition(
        TaskCollector(), OutboxCollector(), StoreCollector()
    )
    return HttpResponse(body, content_type=content_type)
