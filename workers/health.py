"""``/healthz`` and ``/readyz``: what a load balancer, a container's HEALTHCHECK or a monitoring
probe asks (docs/operations.md, "Health checks"). Unauthenticated and cheap, so they answer with
one word per check and nothing else: no versions, hosts or error text.

- ``/healthz``: the process answers (200, ``ok``); it touches neither PostgreSQL nor Redis, so a
  database outage never makes a supervisor restart healthy web processes;
- ``/readyz``: PostgreSQL and Redis reachable and every migration applied (200), else 503.

They live in the engine's layer, not the project's (``koala/`` imports no app): the checks need
the engine's Redis client (``workers.doorbell``) and read through ``workers.selectors.health``.
Mounted by koala/urls.py by dotted string; served by Django's handler under ASGI (koala/asgi.py
routes only /api/ elsewhere).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from workers.selectors.health import readiness, ready


def _plain(body: str, status: int) -> HttpResponse:
    return HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")


@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    return _plain("ok\n", 200)


@never_cache
@require_safe
def readyz(request: HttpRequest) -> HttpResponse:
    checks = readiness()
    body = "".join(f"{name} {value}\n" for name, value in checks.items())
    return _plain(body, 200 if ready(checks) else 503)


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
]
