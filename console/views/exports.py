from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from console.forms import ExportCancelForm, ExportRequestForm
from console.roles import OPERATE, VIEW, actor, page
from console.selectors.exports import list_exports
from console.views.base import render_console
from exports.errors import ExportError
from exports.selectors import exportable_accounts
from exports.services import cancel_export, request_export


def _render(request: HttpRequest, form: ExportRequestForm, *, status: int = 200) -> HttpResponse:
    response = render_console(
        request,
        "console/exports.html",
        title="Exports",
        rows=list_exports(user=request.user, actor=actor(request)),
        request_form=form,
        accounts=exportable_accounts(user=request.user),
    )
    response.status_code = status
    return response


@page(VIEW)
def export_list(request: HttpRequest) -> HttpResponse:
    return _render(request, ExportRequestForm())


@page(VIEW, methods=("POST",))
def export_request(request: HttpRequest) -> HttpResponse:
    """Request an export as the signed-in person. Any console role reaches the form; the export
    service decides whether this person may export that account (members and superusers) and
    audits the request. Bad input re-shows the page with the reason, and nothing is created."""
    form = ExportRequestForm(request.POST)
    if not form.is_valid():
        return _render(request, form, status=400)
    data = form.cleaned_data
    try:
        export = request_export(
            user=request.user,
            account_id=data["account"],
            date_from=data["date_from"],
            date_to=data["date_to"],
            max_rows=data["max_rows"],
        )
    except ExportError as exc:
        form.add_error(None, str(exc))
        return _render(request, form, status=400)
    messages.success(request, f"Export {export.pk} of {export.account.slug} requested (job {export.job_id}); it is listed below.")
    return HttpResponseRedirect(reverse("console:exports"))


@page(OPERATE, methods=("POST",))
def export_cancel(request: HttpRequest, export_id: int) -> HttpResponse:
    form = ExportCancelForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        # The export service decides who may cancel (members of the account and superusers) and audits it.
        export = cancel_export(export_id=export_id, user=request.user, reason=reason)
    except ExportError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Export {export.pk} {export.state}; its job was cancelled with it.")
    return HttpResponseRedirect(reverse("console:exports"))
