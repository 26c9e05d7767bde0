"""Koala's URLs plus ``/_test/boom/``: a view that repeats what the request carried in its logs
and its exception, as a careless view would, then fails (a 500 that Sentry reports)."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from koala import redaction
from koala.urls import urlpatterns as koala_urlpatterns
from workers import kinds
from workers.models import Job

log = logging.getLogger("tests.web")


@csrf_exempt
def boom(request: HttpRequest) -> HttpResponse:
    job_id = request.GET.get("job")
    quoted = ""
    if job_id:
        # As Koala's job pages do: the job's redaction context joins the request's.
        job = Job.objects.get(pk=int(job_id))
        redaction.extend(kinds.job_redactor(job))
        quoted = job.input.get("memo", "")
    carried = (
        f"query {request.GET.urlencode()} form {request.POST.urlencode()} auth {request.headers.get('X-Debug', '')} "
        f"cookies {' '.join(request.COOKIES.values())}"
    )
    log.warning("handling %s %s", carried, quoted)  # a log line and a breadcrumb
    log.error("about to fail: %s", quoted, extra={"carried": carried, "job_memo": quoted})
    raise RuntimeError(f"boom: {carried} {quoted}")


urlpatterns = [path("_test/boom/", boom), *koala_urlpatterns]
