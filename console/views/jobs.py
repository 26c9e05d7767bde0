from __future__ import annotations

import datetime as dt

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import reverse
from django.utils import timezone

from console.forms import BulkActionForm, JobActionForm, JobFilterForm, kind_names, queue_choices
from console.roles import OPERATE, VIEW, actor, page
from console.selectors.jobs import (
    JobFilter,
    ListPaginator,
    failure_groups,
    filtered_jobs,
    job_reviews,
    no_retry_kinds,
    record_list_read,
)
from console.services import BULK_LIMIT, bulk_job_action, job_action
from console.views.base import render_console
from koala import redaction
from workers.errors import JobStateError
from workers.models import Job
from workers.selectors.jobs import job_for_person

PAGE_SIZE = 50
FILTER_KEYS = ("state", "kind", "queue", "cause", "created_after", "created_before", "search")


def _filter_query(data: QueryDict) -> str:
    kept = QueryDict(mutable=True)
    for key in FILTER_KEYS:
        value = data.get(key)
        if isinstance(value, str) and value:
            kept[key] = value
    return kept.urlencode()


@page(VIEW)
def job_list(request: HttpRequest) -> HttpResponse:
    form = JobFilterForm(request.GET)
    try:
        filters = form.to_filter()
        jobs = filtered_jobs(filters)
    except JobStateError:
        filters, jobs = JobFilter(), Job.objects.none()  # an invalid filter lists nothing; the form says why
    paginator = ListPaginator(jobs, PAGE_SIZE)
    jobs_page = paginator.get_page(request.GET.get("page"))
    record_list_read(actor=actor(request), filters=filters, page=jobs_page.number)
    return render_console(
        request,
        "console/jobs.html",
        title="Jobs",
        form=form,
        page_obj=jobs_page,
        filter_query=_filter_query(request.GET),
        kinds=kind_names(),
        queues=[q for q, _ in queue_choices()],
        bulk_limit=BULK_LIMIT,
        no_retry_kinds=no_retry_kinds(),
    )


@page(VIEW)
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    try:
        record = job_for_person(job_id=job_id, actor=actor(request))
    except Job.DoesNotExist:
        raise Http404(f"No job {job_id}.") from None
    redaction.extend(record.redactor)  # for what the template masks itself (|redacted), and any error report
    return render_console(
        request, "console/job_detail.html", title=f"Job {job_id}", record=record, reviews=job_reviews(job_id=job_id)
    )


@page(OPERATE, methods=("POST",))
def job_act(request: HttpRequest, job_id: int) -> HttpResponse:
    form = JobActionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose cancel, retry or requeue.")
    else:
        try:
            messages.success(
                request,
                job_action(
                    action=form.cleaned_data["action"], job_id=job_id, actor=actor(request), reason=form.cleaned_data["reason"]
                ),
            )
        except (JobStateError, Job.DoesNotExist) as exc:
            messages.error(request, str(exc))
    return HttpResponseRedirect(reverse("console:job", args=[job_id]))


@page(OPERATE, methods=("POST",))
def job_bulk(request: HttpRequest) -> HttpResponse:
    form = BulkActionForm(request.POST)
    back = reverse("console:jobs") + "?" + _filter_query(request.POST)
    if not form.is_valid():
        for error in form.non_field_errors() or ["Choose an action and the jobs to apply it to."]:
            messages.error(request, str(error))
        return HttpResponseRedirect(back)
    try:
        if form.cleaned_data["scope"] == "all":
            # The filter is re-applied on the server: what the person saw is what is changed.
            filters = JobFilterForm(request.POST).to_filter()
            ids = list(filtered_jobs(filters).values_list("id", flat=True)[: BULK_LIMIT + 1])
            selection = {"filter": _filter_query(request.POST) or "(no filter)"}
        else:
            ids = form.cleaned_data["ids"]
            selection = {"ids": ",".join(str(i) for i in ids[:100])}
        result = bulk_job_action(
            action=form.cleaned_data["action"],
            job_ids=ids,
            actor=actor(request),
            reason=form.cleaned_data["reason"],
            selection=selection,
        )
    except JobStateError as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)
    if result.done:
        messages.success(request, f"{result.verb}: {len(result.done)} job(s).")
    for error in result.errors[:10]:
        messages.warning(request, error)
    if len(result.errors) > 10:
        messages.warning(request, f"…and {len(result.errors) - 10} more refused.")
    return HttpResponseRedirect(back)


WINDOWS = {"1h": dt.timedelta(hours=1), "24h": dt.timedelta(hours=24), "7d": dt.timedelta(days=7)}


@page(VIEW)
def failures(request: HttpRequest) -> HttpResponse:
    window = request.GET.get("window", "24h")
    if window not in WINDOWS:
        window = "24h"
    since = timezone.now() - WINDOWS[window]
    jobs, attempts = failure_groups(since=since, actor=actor(request))
    return render_console(
        request,
        "console/failures.html",
        title="Failures",
        jobs=jobs,
        attempts=attempts,
        window=window,
        windows=list(WINDOWS),
        since=since,
    )
