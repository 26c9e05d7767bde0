"""The API's own ASGI path: the worker calls (/api/v1/workers/…, /api/v1/leases/…) and the
job and run calls (/api/v1/jobs…, /api/v1/runs…) without Django's request handler around them.

Why: a worker's call is small and frequent (acquire and complete for every job). Django's
ASGIHandler gives each request a thread of its own for its thread-sensitive work (the
request_started/finished signals, sync middleware, closing the response), so a call cost a
thread start and three or more thread hops before the view ran; profiled, that was most of the
API server's CPU per job. Here the same URLconf picks the same async views (api.views.worker),
which do their work in one task of the hub's thread pool; what Django's handler and the API
middleware did for them is done inline: the body is read (bounded), a NUL in the path is refused,
one redaction context is bound, a client that disconnects cancels its call (a waiting acquire
gives back what was claimed for it), and an unexpected error is a JSON 500.

The job and run calls are plain functions (api.views.runs.execute_call marks them ``POOLED``):
each runs as one task of the same thread pool. Under Django's handler each one had a thread of
its own, and with it a database connection of its own (connections are per thread): a new
PostgreSQL session for every call, most of a call's time (bench/http_start.py; bench/README.md).
A pool thread keeps its connection. The NUL guard is the middleware's (path, query, cookies).

Everything else under /api/ (the OpenAPI document, a path that matches nothing) goes through
Django's handler (koala/asgi.py).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse
from django.urls import Resolver404, resolve

from api.http import POOLED, ApiError, max_body_bytes
from api.poller import hub
from koala import redaction
from koala.middleware import nul_refusal

log = logging.getLogger("koala.api")
PREFIXES = ("/api/v1/workers/", "/api/v1/leases/", "/api/v1/jobs", "/api/v1/runs")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


def handles(scope: dict[str, Any]) -> bool:
    return scope["type"] == "http" and str(scope.get("path", "")).startswith(PREFIXES)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole body, or (what was read, True) once it passes the limit (answered 413)."""
    limit = max_body_bytes()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


async def _send(send: Send, response: HttpResponse) -> None:
    body = response.content
    headers = [(name.encode("latin-1"), str(value).encode("latin-1")) for name, value in response.items()]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def worker_calls(scope: dict[str, Any], receive: Receive, send: Send, *, fallback: App) -> None:
    """Serve one worker call; a path under the prefixes that is not a worker call goes to ``fallback``."""
    try:
        body, too_large = await _read_body(receive)
    except asyncio.CancelledError:
        return  # the client left before it finished sending
    if too_large:
        await _send(send, ApiError(413, "too_large", f"the body is larger than {max_body_bytes()} bytes").response())
        return
    path = str(scope.get("path", ""))
    if "\x00" in path:
        await _send(send, ApiError(400, "invalid_request", "the path contains a NUL character (%00)").response())
        return
    try:
        match = resolve(path)
    except Resolver404:
        match = None
    native = match is not None and iscoroutinefunction(match.func)
    if match is None or not (native or getattr(match.func, POOLED, False)):
        await fallback(scope, _replay(body, receive), send)
        return
    request = ASGIRequest(scope, io.BytesIO(body))
    if not native and (refused := nul_refusal(request)) is not None:
        await _send(send, refused)
        return
    with redaction.bind(redaction.Redactor.for_request(request)):
        if native:
            call = asyncio.ensure_future(match.func(request, *match.args, **match.kwargs))
        else:
            # One task of the hub's pool (the redaction context follows it); a client that hangs
            # up does not stop it, as under Django's handler: a started job stays started.
            call = asyncio.ensure_future(hub().call(match.func, request, *match.args, **match.kwargs))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            done, _ = await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if call not in done:
            call.cancel()  # the worker hung up: a waiting acquire gives back what it got
            return
        try:
            response = call.result()
        except ApiError as refused:  # busy: the pool's queue is full (hub().call)
            response = refused.response()
        except Exception:
            log.exception("worker API call %s failed", path)
            response = ApiError(500, "internal_error", "the server failed on this call; it was logged").response()
    await _send(send, response)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands Django's handler the body this module already read, then the rest."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
