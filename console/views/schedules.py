"""Schedules: the list, one schedule (its rule in words, next 10 fires in its zone and UTC, last
runs with outcomes, what a resume or catch-up would fire now) and its actions: pause, resume,
run now, backfill (previewed, then confirmed). Reads through schedules.selectors, writes
through schedules.services."""

from __future__ import annotations

from datetime import datetime

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from console.roles import OPERATE, VIEW, actor, page
from console.views.base import render_console
from schedules import selectors, services
from schedules.errors import ScheduleError


@page(VIEW)
def schedule_list(request: HttpRequest) -> HttpResponse:
    rows = [(schedule, selectors.explanation(schedule)) for schedule in selectors.list_schedules()]
    return render_console(request, "console/schedules.html", title="Schedules", rows=rows)


def _detail(
    request: HttpRequest, schedule_id: int, *, backfill: services.BackfillPlan | None = None, status: int = 200
) -> HttpResponse:
    try:
        detail = selectors.schedule_detail(schedule_id=schedule_id)
    except ScheduleError:
        raise Http404("no such schedule") from None
    response = render_console(
        request, "console/schedule_detail.html", title=f"Schedule {detail.schedule.name}", detail=detail, backfill=backfill
    )
    response.status_code = status
    return response


@page(VIEW)
def schedule_detail(request: HttpRequest, schedule_id: int) -> HttpResponse:
    return _detail(request, schedule_id)


def _moment(text: str, what: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ScheduleError(f"{what} is not a time (ISO 8601 with an offset, e.g. 2026-03-29T02:30:00+02:00).") from None
    if moment.tzinfo is None:
        raise ScheduleError(f"{what} needs an offset (e.g. +02:00 or Z).")
    return moment


@page(OPERATE, methods=("POST",))
def schedule_act(request: HttpRequest, schedule_id: int) -> HttpResponse:
    action = request.POST.get("action", "")
    here = reverse("console:schedule", args=[schedule_id])
    try:
        if action == "pause":
            services.pause_schedule(schedule_id=schedule_id, actor=actor(request), reason=request.POST.get("reason", "")[:500])
            messages.success(request, "Paused: no new slot is decided until it is resumed.")
        elif action == "resume":
            services.resume_schedule(schedule_id=schedule_id, actor=actor(request))
            messages.success(request, "Resumed: the next tick applies the catch-up policy shown below.")
        elif action == "run_now":
            occurrence = services.run_now(schedule_id=schedule_id, actor=actor(request))
            messages.success(request, f"Job #{occurrence.job_id} enqueued now (a manual slot).")
        elif action == "backfill":
            start = _moment(request.POST.get("start", ""), "from")
            end = _moment(request.POST.get("end", ""), "to")
            confirmed = request.POST.get("confirm") == "yes"
            plan = services.backfill(schedule_id=schedule_id, actor=actor(request), start=start, end=end, dry_run=not confirmed)
            if not confirmed:  # the preview: what a confirm would run, with the button to confirm it
                return _detail(request, schedule_id, backfill=plan)
            messages.success(request, f"Backfill: {len(plan.job_ids)} past slots enqueued.")
        else:
            messages.error(request, f"Unknown action {action[:40]!r}.")
    except ScheduleError as exc:
        messages.error(request, str(exc))
    return HttpResponseRedirect(here)
