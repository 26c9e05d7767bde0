"""Request middleware of the web process."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from whitenoise.middleware import WhiteNoiseMiddleware

NUL = "\x00"


class RejectNulBytesMiddleware:
    """Answer 400 to any request whose path, query string, form body or cookies hold a NUL.

    PostgreSQL text cannot store NUL: a NUL that reaches a query raises DataError, and every
    view that filters, searches or saves what a person sent would answer 500 (an admin list
    filter did). No Koala input is legitimately NUL, so one check before any view runs covers
    every page, the admin's, the console's and django-rq's alike, instead of each view guarding
    its own parameters.
    """

    sync_capable = True
    async_capable = True  # under ASGI, never a thread per request (see koala.redaction.RedactionMiddleware)

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        refusal = self._refusal(request)
        if iscoroutinefunction(self):
            return self._acall(request, refusal)
        return refusal or self.get_response(request)

    async def _acall(self, request: HttpRequest, refusal: HttpResponse | None) -> HttpResponse:
        return refusal or await self.get_response(request)

    @staticmethod
    def _refusal(request: HttpRequest) -> HttpResponse | None:
        return nul_refusal(request)


def nul_refusal(request: HttpRequest) -> HttpResponse | None:
    """The 400 for a request that carries a NUL anywhere Koala reads (None when it carries none):
    this middleware's answer, also given where the API serves calls without Django's handler."""
    where = nul_in_request(request)
    if where is None:
        return None
    return HttpResponseBadRequest(
        f"Bad request: {where} contains a NUL character (%00), which Koala never accepts. "
        "Remove it and send the request again.\n",
        content_type="text/plain; charset=utf-8",
    )


# WhiteNoise answers with a file iterator; under ASGI Django consumes it on a thread and warns once
# per file that it is synchronous. That is the intended trade here (static files are small and
# served from the same process only in simple deployments); the warning would fill the log.
warnings.filterwarnings(
    "ignore", message="StreamingHttpResponse must consume synchronous iterators", module="django.core.handlers.asgi"
)


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, usable in both modes: its own ``__call__`` is sync only, which under the ASGI
    server would put every request (a long-polling acquire too) on a thread of its own. The file
    lookup is a dictionary read (a stat with autorefresh, in development), so it runs inline."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        super().__init__(get_response)
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if not iscoroutinefunction(self):
            return super().__call__(request)
        return self._acall(request)

    async def _acall(self, request: HttpRequest) -> Any:
        if self.autorefresh:
            static_file = self.find_file(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)


def nul_in_request(request: HttpRequest) -> str | None:
    """Where the request carries a NUL ("the path", "query parameter 'q'", …), or None."""
    if NUL in request.path_info or NUL in request.path:
        return "the path"
    for name, values in (("query parameter", request.GET.lists()), ("cookie", _single(request.COOKIES.items()))):
        found = _first_nul(values)
        if found is not None:
            return f"{name} '{found}'"
    # Only forms: the body of another content type is read by the view that understands it.
    if request.method == "POST" and request.content_type in {"application/x-www-form-urlencoded", "multipart/form-data"}:
        found = _first_nul(request.POST.lists())
        if found is not None:
            return f"form field '{found}'"
    return None


def _single(items: Iterable[tuple[str, str]]) -> Iterable[tuple[str, list[str]]]:
    return ((key, [value]) for key, value in items)


def _first_nul(pairs: Iterable[tuple[str, list[str]]]) -> str | None:
    for key, values in pairs:
        if NUL in key or any(NUL in value for value in values):
            return key.replace(NUL, "\\x00")
    return None
