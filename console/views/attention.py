from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from console.forms import ResolveForm
from console.roles import OPERATE, VIEW, actor, page
from console.selectors.attention import open_operations
from console.views.base import render_console
from workers.services.operations import resolve_operation


def _render(request: HttpRequest, *, failed_form: tuple[int, ResolveForm] | None = None, status: int = 200) -> HttpResponse:
    rows = open_operations(actor=actor(request))
    forms = {row.operation.pk: ResolveForm() for row in rows}
    if failed_form is not None:
        forms[failed_form[0]] = failed_form[1]
    for row in rows:
        row.form = forms[row.operation.pk]
    response = render_console(request, "console/attention.html", title="Needs attention", rows=rows)
    response.status_code = status
    return response


@page(VIEW)
def attention(request: HttpRequest) -> HttpResponse:
    return _render(request)


@page(OPERATE, methods=("POST",))
def resolve(request: HttpRequest, operation_id: int) -> HttpResponse:
    form = ResolveForm(request.POST)
    if form.is_valid():
        happened = form.cleaned_data["outcome"] == "happened"
        try:
            operation = resolve_operation(
                operation_id=operation_id,
                happened=happened,
                external_id=form.cleaned_data["external_id"].strip(),
                note=form.cleaned_data["note"],
                actor=actor(request),
            )
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            verdict = "happened" if happened else "did not happen; it will be re-sent under the same key"
            messages.success(request, f"Operation {operation.name} of job {operation.job_id} recorded as: {verdict}.")
            return HttpResponseRedirect(reverse("console:attention"))
    return _render(request, failed_form=(operation_id, form), status=400)
