"""The worker calls (register, acquire, heartbeat, complete, fail, and stop), and the ledger's two,
as async views: parse, authenticate, call api.protocol.

Async because acquire holds its request open for up to a minute: under the ASGI server a waiting
worker costs a future, not a thread. Every database call runs in the hub's thread pool
(``hub().run``). Worker calls are not audited (R19: a machine loop would bury people's reads).
"""

from __future__ import annotations

import functools
import logging
import re
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api import http, keys, protocol
from api.http import ApiError, invalid
from api.keys import KeyScope, Principal
from api.poller import OverConcurrency, hub
from workers.services.leases import HeldLease

log = logging.getLogger("koala.api")
NAME = re.compile(protocol.NAME_PATTERN)

View = Callable[..., Coroutine[Any, Any, HttpResponse]]


def worker_call(view: Callable[..., HttpResponse]) -> View:
    """POST only, a key with the worker scope, a JSON object body; every refusal a JSON error.

    ``view`` is a plain function; the whole call (key, body, the call's own queries) runs as ONE
    task in the hub's thread pool: a worker's call costs one thread hop, not one per query.
    """

    @functools.wraps(view)
    async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            allow = {"Allow": "POST"}
            return ApiError(
                405, "method_not_allowed", f"{request.method} is not allowed here; use POST", headers=allow
            ).response()
        try:
            return await hub().call(_serve, view, request, args, kwargs)
        except ApiError as refused:  # busy: the pool's queue is full
            return refused.response()

    return csrf_exempt(wrapped)


def _post_only(request: HttpRequest) -> HttpResponse:
    refused = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here; use POST", headers={"Allow": "POST"})
    return refused.response()


def _serve(view: Callable[..., Any], request: HttpRequest, args: Any, kwargs: dict[str, Any]) -> Any:
    try:
        principal = _principal(request)
        data = http.json_body(request)
        return view(request, principal, data, *args, **kwargs)
    except ApiError as refused:
        return refused.response()
    except (OperationalError, InterfaceError) as exc:
        # The database is away (a restart, a failover): the worker backs off and tries again.
        log.warning("worker API call %s: database unavailable (%s)", view.__name__, type(exc).__name__)
        return http.unavailable().response()


def _principal(request: HttpRequest) -> Principal:
    principal = keys.authenticate(request.headers.get("Authorization"))
    keys.require(principal, KeyScope.WORKER)
    return principal


def _lease_fields(data: dict[str, Any]) -> tuple[str, str]:
    worker_id = http.text(data, "worker_id")
    token = http.text(data, "lease_token", max_length=120)
    return worker_id, token


def _held(principal: Principal, data: dict[str, Any], lease_id: int) -> HeldLease:
    worker_id, token = _lease_fields(data)
    hub().seen(worker_id)
    return protocol.held_lease(lease_id=lease_id, worker_id=worker_id, token=token, key_prefix=principal.prefix)


def _kinds(data: dict[str, Any]) -> list[tuple[str, int, list[str]]]:
    value = data.get("kinds")
    if not isinstance(value, list) or not value:
        raise invalid("kinds", "must be a non-empty list")
    if len(value) > 500:
        raise invalid("kinds", "at most 500 kinds")
    served: list[tuple[str, int, list[str]]] = []
    for index, item in enumerate(value):
        where = f"kinds[{index}]"
        if isinstance(item, str):  # "name@version" shorthand
            name, _, version_text = item.rpartition("@")
            if not name or not version_text.isascii() or not version_text.isdigit():
                raise invalid(where, 'must be {"name": …, "version": …} or "name@version"')
            served.append((name, int(version_text), []))
            continue
        if not isinstance(item, dict):
            raise invalid(where, "must be an object")
        name = http.text(item, "name", max_length=100)
        version = http.integer(item, "version", minimum=1, maximum=2**31 - 1, default=1)
        steps = item.get("steps") or []
        if not isinstance(steps, list) or not all(isinstance(s, str) and 0 < len(s) <= 100 for s in steps):
            raise invalid(f"{where}.steps", "must be a list of step ids (1 to 100 characters)")
        served.append((name, version, list(steps)))
    return served


@worker_call
def register(request: HttpRequest, principal: Principal, data: dict[str, Any]) -> HttpResponse:
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not NAME.fullmatch(name)):
        raise invalid("name", "must be 1 to 200 of A-Z a-z 0-9 . _ @ + -")
    hostname = http.text(data, "hostname", required=False, max_length=255) or socket.gethostname()
    pid = http.integer(data, "pid", minimum=0, maximum=2**31 - 1, default=0)
    queues = data.get("queues")
    if queues is not None and (not isinstance(queues, list) or not all(isinstance(q, str) and q for q in queues)):
        raise invalid("queues", "must be a list of queue names")
    concurrency = http.integer(data, "concurrency", minimum=1, maximum=protocol.MAX_CONCURRENCY, default=1)
    sdk = http.text(data, "sdk", required=False, max_length=60)
    served = _kinds(data)
    if name is None and not re.fullmatch(protocol.NAME_PATTERN, f"http.{hostname}.{pid}"):
        raise invalid("hostname", "cannot name a worker; give a name")
    registration = protocol.register(
        key_prefix=principal.prefix,
        name=name,
        hostname=hostname,
        pid=pid,
        served_kinds=served,
        queues=queues,
        concurrency=concurrency,
        sdk=sdk,
        principal=principal,
    )
    hub().announce("start", registration.worker_id)
    return JsonResponse(
        {
            "worker_id": registration.worker_id,
            "lease_seconds": float(settings.KOALA_LEASE_SECONDS),
            "heartbeat_seconds": float(settings.KOALA_HEARTBEAT_SECONDS),
            "poll_seconds": poll_seconds(),
            "concurrency": registration.concurrency,
            "queues": list(registration.queues),
            "kinds": list(registration.served),
        }
    )


def poll_seconds() -> float:
    return float(getattr(settings, "KOALA_API_ACQUIRE_WAIT_SECONDS", 60.0))


def _acquiring(
    request: HttpRequest, principal: Principal, data: dict[str, Any], worker_id: str
) -> tuple[protocol.Registration, int, float]:
    registration = protocol.registration(worker_id=worker_id, key_prefix=principal.prefix)
    # Checked again at every acquire, against the key as this process knows it now (keys are
    # re-read every KOALA_API_KEY_CACHE_SECONDS): a registration stored before the key's limits
    # (a row edited by hand, an older server) never gets a lease outside them.
    keys.require_serves(principal, served=registration.served, queues=registration.queues)
    count = http.integer(data, "max", minimum=1, maximum=protocol.MAX_CONCURRENCY, default=1)
    wait = http.number(data, "wait_seconds", minimum=0, maximum=poll_seconds(), default=poll_seconds()) or 0.0
    if count > registration.concurrency:
        # This process's reading may predate a registration through another one: ask the row.
        registration = protocol.registration(worker_id=worker_id, key_prefix=principal.prefix, fresh=True)
        keys.require_serves(principal, served=registration.served, queues=registration.queues)
    if count > registration.concurrency:
        raise ApiError(
            429,
            "concurrency_exceeded",
            f"max {count} exceeds this worker's concurrency of {registration.concurrency}",
            headers={"Retry-After": "1"},
        )
    return registration, count, wait


@csrf_exempt
async def acquire(request: HttpRequest, worker_id: str) -> HttpResponse:
    """The long-poll: the key, body and registration in one pool task, then a wait in the hub
    that holds no thread."""
    if request.method != "POST":
        return ApiError(
            405, "method_not_allowed", f"{request.method} is not allowed here; use POST", headers={"Allow": "POST"}
        ).response()
    try:
        prepared = await hub().call(_serve, _acquiring, request, (), {"worker_id": worker_id})
    except ApiError as refused:  # busy: the pool's queue is full
        return refused.response()
    if isinstance(prepared, HttpResponse):
        return prepared
    registration, count, wait = prepared
    try:
        got = await hub().acquire(registration, count=count, wait=wait)
    except ApiError as refused:  # busy: as many acquires wait here as KOALA_API_MAX_WAITING allows
        return refused.response()
    except OverConcurrency as over:
        return ApiError(
            429,
            "concurrency_exceeded",
            f"this worker holds {over.held} leases of its concurrency {registration.concurrency}; finish one first",
            headers={"Retry-After": "1"},
        ).response()
    except (OperationalError, InterfaceError) as exc:
        log.warning("worker API acquire: database unavailable (%s)", type(exc).__name__)
        return http.unavailable().response()
    if not got:
        return HttpResponse(status=204)
    return JsonResponse({"leases": [protocol.lease_payload(lease, worker_id=worker_id) for lease in got]})


@worker_call
def stop(request: HttpRequest, principal: Principal, data: dict[str, Any], worker_id: str) -> HttpResponse:
    """The worker stops: its waiting acquire answers 204 now; its exit is recorded once it holds no lease."""
    reason = http.text(data, "reason", required=False, max_length=200)
    stopped = protocol.stop(worker_id=worker_id, key_prefix=principal.prefix, reason=reason)
    hub().announce("stop", worker_id)
    return JsonResponse({"worker_id": worker_id, "held": stopped.held, "exited": stopped.exited})


@worker_call
def heartbeat(request: HttpRequest, principal: Principal, data: dict[str, Any], lease_id: int) -> HttpResponse:
    progress = http.obj(data, "progress")
    held = _held(principal, data, lease_id)
    answer = protocol.heartbeat(held=held, progress=progress)
    return JsonResponse(answer)


@worker_call
def complete(request: HttpRequest, principal: Principal, data: dict[str, Any], lease_id: int) -> HttpResponse:
    state_delta = http.obj(data, "state_delta") or {}
    usage = http.obj(data, "usage")
    if usage is not None:
        protocol.check_usage(usage)
    spans = data.get("spans") or []
    if not isinstance(spans, list):
        raise invalid("spans", "must be a list")
    duration = http.number(data, "duration_seconds", minimum=0, maximum=10**7, default=0.0) or 0.0
    held = _held(principal, data, lease_id)
    checked = protocol.check_spans(spans, step_span=protocol.span_id_of(held.lease))
    outcome = protocol.complete(
        held=held,
        output=data.get("output"),
        state_delta=state_delta,
        usage=usage,
        spans=checked,
        duration_seconds=duration,
    )
    return JsonResponse({"outcome": outcome})


@worker_call
def fail(request: HttpRequest, principal: Principal, data: dict[str, Any], lease_id: int) -> HttpResponse:
    classification = http.text(data, "classification", max_length=20)
    if classification not in protocol.CLASSIFICATIONS:
        raise invalid("classification", f"must be one of {', '.join(protocol.CLASSIFICATIONS)}")
    error_class = http.text(data, "error_class", required=False, max_length=200)
    if error_class and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}", error_class):
        raise invalid("error_class", "must be a class name (letters, digits, _ . : -)")
    message = http.text(data, "message", required=False, max_length=100_000)
    retry_after = http.number(data, "retry_after", minimum=0, maximum=86400)
    body_started = http.boolean(data, "body_started", default=True)
    safe_point = http.boolean(data, "safe_point", default=False)
    spans = data.get("spans") or []
    if not isinstance(spans, list):
        raise invalid("spans", "must be a list")
    held = _held(principal, data, lease_id)
    checked = protocol.check_spans(spans, step_span=protocol.span_id_of(held.lease))
    outcome = protocol.fail(
        held=held,
        classification=classification,
        error_class=error_class,
        message=message,
        retry_after=retry_after,
        body_started=body_started,
        safe_point=safe_point,
        spans=checked,
    )
    return JsonResponse({"outcome": outcome})


@worker_call
def begin_operation(request: HttpRequest, principal: Principal, data: dict[str, Any], lease_id: int) -> HttpResponse:
    name = http.text(data, "name", max_length=100)
    options: dict[str, Any] = {
        "kind": http.text(data, "kind", max_length=50),
        "params": http.obj(data, "params") or {},
        "estimate_minor": http.integer(data, "estimate_minor", minimum=0, maximum=10**15, default=0),
        "currency": http.text(data, "currency", required=False, max_length=3),
        "target": http.text(data, "target", required=False, max_length=200),
    }
    if options["currency"] and not re.fullmatch(r"[A-Z]{3}", options["currency"]):
        raise invalid("currency", "must be a 3-letter code in capitals (ISO 4217), or absent for KOALA_COST_CURRENCY")
    if data.get("amount_minor") is not None:
        options["amount_minor"] = http.integer(data, "amount_minor", minimum=0, maximum=10**15)
    key = http.text(data, "key", required=False, max_length=300)
    if key:
        options["key"] = key
    can_look_up = http.boolean(data, "can_look_up", default=False)
    lookup = http.obj(data, "lookup")
    held = _held(principal, data, lease_id)
    answer = protocol.begin_operation(held=held, name=name, options=options, can_look_up=can_look_up, lookup=lookup)
    return JsonResponse(answer)


@worker_call
def settle_operation(
    request: HttpRequest, principal: Principal, data: dict[str, Any], lease_id: int, operation_id: int
) -> HttpResponse:
    outcome = http.text(data, "outcome", max_length=20)
    if outcome not in protocol.SETTLE_OUTCOMES:
        raise invalid("outcome", f"must be one of {', '.join(protocol.SETTLE_OUTCOMES)}")
    found = {k: data.get(k) for k in ("external_id", "data", "cost_minor", "usage")}
    message = http.text(data, "message", required=False, max_length=100_000)
    retry_after = http.number(data, "retry_after", minimum=0, maximum=86400)
    held = _held(principal, data, lease_id)
    answer = protocol.settle_operation(
        held=held,
        operation_id=operation_id,
        outcome=outcome,
        found=found,
        message=message,
        retry_after=retry_after,
    )
    return JsonResponse(answer)
