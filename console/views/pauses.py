from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from console.forms import PauseForm, ResumeForm, kind_names, queue_choices
from console.roles import OPERATE, VIEW, actor, page
from console.views.base import render_console
from workers.models import Pause, Scope
from workers.services.pauses import active_pauses, pause, resume


def _render(request: HttpRequest, form: PauseForm, *, status: int = 200) -> HttpResponse:
    response = render_console(
        request,
        "console/pauses.html",
        title="Pause controls",
        form=form,
        active=active_pauses(),
        history=Pause.objects.order_by("-created_at")[:30],
        queues=[q for q, _ in queue_choices()],
        kinds=kind_names(),
    )
    response.status_code = status
    return response


@page(VIEW)
def pause_list(request: HttpRequest) -> HttpResponse:
    initial = {k: request.GET[k] for k in ("scope", "target", "tenant") if k in request.GET}
    return _render(request, PauseForm(initial=initial))


@page(OPERATE, methods=("POST",))
def pause_create(request: HttpRequest) -> HttpResponse:
    form = PauseForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    data = form.cleaned_data
    if data["scope"] == Scope.GLOBAL and not data["tenant"] and not data["confirm"]:
        # A global pause stops everything: a second, explicit step (no JavaScript needed).
        return render_console(request, "console/pause_confirm.html", title="Confirm global pause", form=form)
    try:
        row = pause(
            scope=data["scope"],
            target=data["target"],
            tenant=data["tenant"],
            mode=data["mode"],
            reason=data["reason"],
            actor=actor(request),
            expires_at=form.expires_at(),
        )
    except ValueError as exc:
        form.add_error(None, str(exc))
        return _render(request, form, status=400)
    messages.success(request, f"Paused {row.covers} ({row.mode}).")
    return HttpResponseRedirect(reverse("console:pauses"))


@page(OPERATE, methods=("POST",))
def pause_resume(request: HttpRequest, pause_id: int) -> HttpResponse:
    form = ResumeForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    try:
        row = resume(pause_id=pause_id, actor=actor(request), note=note)
        messages.success(request, f"Resumed {row.covers}.")
    except ValueError as exc:
        messages.error(request, str(exc))
    return HttpResponseRedirect(reverse("console:pauses"))
