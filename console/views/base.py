"""What every console page shares: the admin's context (header, sidebar, user tools) and
the viewer's permissions, so templates can explain a disabled button instead of hiding it."""

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
            "title": title,
            "can_operate": can(request, OPERATE),
            "can_review": can(request, REVIEW),
            **context,
        },
    )
