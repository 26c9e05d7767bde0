"""GET /metrics: Prometheus' text format (docs/metrics.md). Authorized first (metrics.auth), then
one snapshot (metrics.selectors) rendered through prometheus_client (metrics.exposition).

A database that does not answer is a scrape that says so: 200 with ``koala_up 0`` (and the
scrape's duration), so an alert on ``koala_up == 0`` fires instead of the target merely vanishing.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from metrics import auth, exposition, services
from metrics.selectors import Snapshot, snapshot

log = logging.getLogger(__name__)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    verdict = auth.decide(
        token=settings.KOALA_METRICS_TOKEN,
        authorization=request.headers.get("Authorization", ""),
        remote_addr=request.META.get("REMOTE_ADDR", ""),
    )
    if verdict is auth.Verdict.UNAUTHORIZED:
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="koala-metrics"'
        return response
    if verdict is auth.Verdict.FORBIDDEN:
        return HttpResponse(
            "forbidden: no KOALA_METRICS_TOKEN is configured, so only loopback clients may scrape\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    started = time.perf_counter()
    try:
        # This process's own pending rejections first (the API's refusals met in async code wait
        # for a sync moment to be written: this is one).
        services.flush_rejections()
        snap, up = snapshot(), True
    except DatabaseError as exc:
        log.warning("metrics: the database did not answer the scrape (%s)", type(exc).__name__)
        connection.close_if_unusable_or_obsolete()
        snap, up = Snapshot(now=timezone.now()), False
    built = exposition.families(snap, scrape_seconds=time.perf_counter() - started, up=up)
    response = HttpResponse(exposition.render(built), content_type=exposition.CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
