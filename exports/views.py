"""The download view: parses the request, asks the service, streams the object."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.http import require_GET

from exports.errors import ExportNotFound, ExportNotReady, ExportObjectMissing, ExportPermissionDenied
from exports.services import open_download


@require_GET
@login_required
def download(request: HttpRequest, export_id: int) -> HttpResponseBase:
    try:
        found = open_download(export_id=export_id, user=request.user)  # type: ignore[arg-type]
    except (ExportNotFound, ExportPermissionDenied):
        # The same answer for "no such export" and "not yours": ids are sequential, and an
        # outsider learns nothing by probing them.
        raise Http404("no such export") from None
    except ExportNotReady as exc:
        return HttpResponse(str(exc), status=409, content_type="text/plain; charset=utf-8")
    except ExportObjectMissing as exc:
        # Only people who may download it get here: telling them it is gone reveals nothing.
        return HttpResponse(str(exc), status=410, content_type="text/plain; charset=utf-8")
    response = FileResponse(found.handle, as_attachment=True, filename=found.filename, content_type="text/csv; charset=utf-8")
    response["Content-Length"] = str(found.size)
    response["X-Content-SHA256"] = found.checksum  # lets a client verify what it received
    response["Cache-Control"] = "private, no-store"
    return response
