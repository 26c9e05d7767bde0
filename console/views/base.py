"""What every console page shares: the admin's context (header, user tools) and the viewer's
permissions, so templates can explain a disabled button instead of hiding it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from console.roles import OPERATE, REVIEW, can


def render_console(request: HttpRequest, template: str, *, title: str, **context: Any) -> TemplateResponse:
    return TemplateResponse(
        request,
        template,
        {
            **admin.site.each_context(request),
            # The console's own navigation is in the header; the admin's model sidebar would take
            # a quarter of a 1280 px window from tables that need the width (it stays on admin pages).
            "is_nav_sidebar_enabled": False,
            "title": title,
            "can_operate": can(request, OPERATE),
            "can_review": can(request, REVIEW),
            **context,
        },
    )
