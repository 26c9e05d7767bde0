from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from console.forms import ExportCancelForm
from console.roles import OPERATE, VIEW, actor, page
from console.selectors.exports import list_exports
from console.views.base import render_console
from exports.errors import ExportError
from exports.services import cancel_export


@page(VIEW)
def export_list(request: HttpRequest) -> HttpResponse:
    rows = list_exports(user=request.user, actor=actor(request))
    return render_console(request, "console/exports.html", title="Exports", rows=rows)


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
