from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from console.roles import VIEW, page
from console.selectors.dashboard import build_dashboard
from console.views.base import render_console


@page(VIEW)
def dashboard(request: HttpRequest) -> HttpResponse:
    # Auto-refresh is a plain <meta refresh> (no JavaScript), bounded to sane intervals.
    refresh = request.GET.get("refresh", "")
    # isascii: str.isdigit() also accepts digits int() refuses ("²").
    seconds = int(refresh) if refresh.isascii() and refresh.isdigit() and 5 <= int(refresh) <= 300 else None
    return render_console(
        request, "console/dashboard.html", title="Operations dashboard", board=build_dashboard(), refresh=seconds
    )
