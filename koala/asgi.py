"""The ASGI entry: what `make run` and production serve (uvicorn koala.asgi:application).

Under ASGI the worker API's acquire (api.views.worker) waits as a coroutine, so an idle fleet
costs one open request per worker and no thread; the admin, console and exports run as before
(Django runs their sync views on threads). koala/wsgi.py stays for a WSGI server that serves
everything except the long-polling acquire.

The worker calls (/api/v1/workers/…, /api/v1/leases/…) are served by api/asgi.py directly. Other
requests under /api/ go through a handler with the API's own, shorter middleware list: the
same URLconf and views, but no sessions, CSRF, messages or clickjacking headers (the API takes
keys, never cookies). Under ASGI each of Django's ``MiddlewareMixin`` middleware runs its hooks
through ``sync_to_async``: seven of them cost a worker about fourteen thread hops per call.
"""

import importlib
import os
from typing import Any

from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "koala.settings")
site = get_asgi_application()  # sets Django up; the full middleware list (settings.MIDDLEWARE)

# Redaction first (one context per request), then the NUL guard; both native in async mode.
API_MIDDLEWARE = ["koala.redaction.RedactionMiddleware", "koala.middleware.RejectNulBytesMiddleware"]


class ApiHandler(ASGIHandler):
    """Django's ASGI handler, loading API_MIDDLEWARE instead of settings.MIDDLEWARE."""

    def load_middleware(self, is_async: bool = False) -> None:
        # load_middleware reads settings.MIDDLEWARE; swap it only while this handler is built, at
        # import time, before any request is served (no other thread reads it then).
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = API_MIDDLEWARE
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = full


api = ApiHandler()
# The worker calls' own path (api/asgi.py: no Django request handler around the hot calls), named
# by its dotted path like an installed app, so the project imports no app.
worker_calls = importlib.import_module(settings.KOALA_API_ASGI_MODULE)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if worker_calls.handles(scope):
        await worker_calls.worker_calls(scope, receive, send, fallback=api)
    elif scope["type"] == "http" and scope.get("path", "").startswith("/api/"):
        await api(scope, receive, send)
    else:
        await site(scope, receive, send)
