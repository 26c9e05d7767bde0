"""Workflow runs in the console: the list (with the start form), one run's journal (with the
signal and cancel forms), and the stranded runs (with the move action).

The views parse and call ``flows.services`` (which audit every change in its transaction) and
the console's readers (which audit every person's read). A bad input re-shows the page with the
form's or the service's named error, status 400, and nothing changed.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import reverse

from console.forms import CancelRunForm, MoveRunForm, RunFilterForm, SignalForm, StartRunForm
from console.roles import RUN_WORKFLOWS, SIGNAL_RUNS, VIEW, actor, can, page
from console.selectors.runs import journal_for_person, runs_page
from console.views.base import render_console
from flows import selectors as flow_selectors
from flows import services as flow_services
from flows.errors import FlowError, UnknownRun
from koala import redaction
from workers import definitions


def _list(request: HttpRequest, start_form: StartRunForm, *, status: int = 200) -> HttpResponse:
    filters = RunFilterForm(request.GET)
    data = filters.cleaned_data if filters.is_valid() else {}
    listed = runs_page(
        actor=actor(request), state=data.get("state") or "", definition=data.get("definition") or "", before=data.get("before")
    )
    kept = QueryDict(mutable=True)
    for key in ("state", "definition"):
        if data.get(key):
            kept[key] = data[key]
    response = render_console(
        request,
        "console/runs.html",
        title="Runs",
        filters=filters,
        listed=listed,
        filter_query=kept.urlencode(),
        start_form=start_form,
        definitions=definitions.definitions(),
        can_run=can(request, RUN_WORKFLOWS),
    )
    response.status_code = status
    return response


@page(VIEW)
def run_list(request: HttpRequest) -> HttpResponse:
    return _list(request, StartRunForm())


@page(RUN_WORKFLOWS, methods=("POST",))
def run_start(request: HttpRequest) -> HttpResponse:
    form = StartRunForm(request.POST)
    if not form.is_valid():
        return _list(request, form, status=400)
    data = form.cleaned_data
    try:
        started = flow_services.start_run(
            definition=data["definition"],
            version=data["version"],
            input=data["input"],
            idempotency_key=data["idempotency_key"] or None,
            actor=actor(request),
        )
    except FlowError as exc:
        form.add_error(None, f"{exc.code}: {exc}")
        return _list(request, form, status=400)
    run = started.run
    if started.created:
        messages.success(request, f"Run {run.pk} of {run.definition}@{run.version} started.")
    else:
        messages.info(request, f"Run {run.pk} was already started with this key and input; nothing new was started.")
    return HttpResponseRedirect(reverse("console:run", args=[run.pk]))


def _detail(
    request: HttpRequest, run_id: int, *, signal_form: SignalForm, cancel_form: CancelRunForm, status: int = 200
) -> HttpResponse:
    try:
        journal = journal_for_person(run_id=run_id, actor=actor(request))
    except UnknownRun:
        raise Http404(f"No run {run_id}.") from None
    redaction.extend(journal.redactor)  # the template's own |redacted, and any error report while rendering
    response = render_console(
        request,
        "console/run_detail.html",
        title=f"Run {run_id}",
        journal=journal,
        run=journal.run,
        signal_form=signal_form,
        cancel_form=cancel_form,
        live=journal.run.state in ("running", "waiting"),
        can_run=can(request, RUN_WORKFLOWS),
        can_signal=can(request, SIGNAL_RUNS),
    )
    response.status_code = status
    return response


@page(VIEW)
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    return _detail(request, run_id, signal_form=SignalForm(), cancel_form=CancelRunForm())


@page(SIGNAL_RUNS, methods=("POST",))
def run_signal(request: HttpRequest, run_id: int) -> HttpResponse:
    form = SignalForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            answer = flow_services.send_signal(
                run_id=run_id, name=data["name"], key=data["key"], payload=data["payload"], actor=actor(request)
            )
        except UnknownRun:
            raise Http404(f"No run {run_id}.") from None
        except FlowError as exc:
            form.add_error(None, f"{exc.code}: {exc}")
        else:
            said = {
                "resumed": "a waiting step took it; the run goes on",
                "buffered": "no step waits for it yet: it is kept, and the wait takes it when reached",
                "duplicate": "this name and key were sent before: nothing changed",
                "rejected": "the run has finished: nothing changed",
            }[answer.outcome]
            level = messages.success if answer.outcome in ("resumed", "buffered") else messages.warning
            level(request, f"Signal {data['name']}: {answer.outcome} ({said}).")
            return HttpResponseRedirect(reverse("console:run", args=[run_id]))
    return _detail(request, run_id, signal_form=form, cancel_form=CancelRunForm(), status=400)


@page(RUN_WORKFLOWS, methods=("POST",))
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    form = CancelRunForm(request.POST)
    if form.is_valid():
        try:
            run = flow_services.cancel_run(run_id=run_id, actor=actor(request), reason=form.cleaned_data["reason"])
        except UnknownRun:
            raise Http404(f"No run {run_id}.") from None
        except FlowError as exc:
            form.add_error(None, f"{exc.code}: {exc}")
        else:
            messages.success(request, f"Run {run.pk} {run.state}; its queued steps are cancelled, running ones told to stop.")
            return HttpResponseRedirect(reverse("console:run", args=[run_id]))
    return _detail(request, run_id, signal_form=SignalForm(), cancel_form=form, status=400)


def _stranded(request: HttpRequest, *, error: str = "", status: int = 200) -> HttpResponse:
    rows = flow_selectors.stranded_runs()
    response = render_console(
        request,
        "console/runs_stranded.html",
        title="Stranded runs",
        rows=[(row, [v for v in definitions.versions(row.definition) if v != row.version]) for row in rows],
        error=error,
        served=sorted(flow_selectors.served_pairs()),
        can_run=can(request, RUN_WORKFLOWS),
    )
    response.status_code = status
    return response


@page(VIEW)
def stranded(request: HttpRequest) -> HttpResponse:
    return _stranded(request)


@page(RUN_WORKFLOWS, methods=("POST",))
def run_move(request: HttpRequest, run_id: int) -> HttpResponse:
    form = MoveRunForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(" ".join(str(e) for e in errors) for errors in form.errors.values())
        return _stranded(request, error=f"Run {run_id} was not moved: {problems}", status=400)
    try:
        run = flow_services.move_to_version(run_id=run_id, to_version=form.cleaned_data["to_version"], actor=actor(request))
    except UnknownRun:
        raise Http404(f"No run {run_id}.") from None
    except FlowError as exc:
        return _stranded(request, error=f"Run {run_id} was not moved: {exc.code}: {exc}", status=400)
    messages.success(request, f"Run {run.pk} now at {run.definition}@{run.version}: its next step runs at that version.")
    return HttpResponseRedirect(reverse("console:stranded"))
