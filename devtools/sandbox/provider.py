"""A payment provider and a priced model API on 127.0.0.1, for the tests and the demo.

A real HTTP server (stdlib ``ThreadingHTTPServer``), so Koala's provider clients run their real
code: sockets, timeouts, status codes, headers. Run it in a thread (``FakeProvider``, the
``provider`` fixture in tests/support/effects.py) or as a process that worker subprocesses,
restarts and the demo can share::

    python -m devtools.sandbox.provider --port 8765 --state /tmp/provider.jsonl [--api-key KEY]

API (JSON in and out; every POST honours an ``Idempotency-Key`` header)::

    POST /v1/orders           {"reference", "amount_minor", "currency", "description"?}
    POST /v1/charges          {"order", "amount_minor", "currency", "description"?}
    POST /v1/models/complete  {"model", "prompt", "max_tokens"?} -> usage {input_tokens, output_tokens}
    GET  /v1/{orders,charges,completions}?idempotency_key=K   200 object | 404 no object (yet) | 202 processing
                                                              | 501 lookup disabled
    GET  /v1/{orders,charges,completions}/<id>
    POST /_control            {"fault": NAME, ...} or {"reset": true}: script faults (below)
    GET  /_control            counters: requests in flight now and the maximum seen, per resource

Idempotency behaves like Stripe's: the same key with the same body returns the stored object
(header ``Idempotent-Replayed: true``) and has no second effect; the same key with another body
is refused with 422 ``idempotency_key_reused``; a request whose key is still being processed by
another request gets 409 ``idempotency_key_in_use``. Refusals (4xx) are not stored under the key.

Every effect is appended (and fsync'ed) to a JSON-lines state file *before* the response is
sent, together with a line per request and per lookup. Tests in other processes, and a
restarted provider, read the same file: "exactly one charge" is counted there, the outside
world's own record, not in Koala's tables.

Faults (``POST /_control``; ``resource`` limits one to orders/charges/completions, ``times`` to
that many requests, otherwise it lasts until ``{"reset": true}``)::

    {"fault": "commit_then_timeout", "seconds": S}  record the effect, then hold the reply S seconds
    {"fault": "5xx", "status": 503, "message": "..."}  fail before doing anything
    {"fault": "429", "retry_after": 2}              rate limited, with a Retry-After header
    {"fault": "decline", "status": 402, "code": "card_declined", "message": "..."}  a business refusal
    {"fault": "lookup_disabled"}                    lookups answer 501: nothing can be reconciled
                                                    (with "times": that many lookups)
    {"fault": "slow", "seconds": S}                 hold each request S seconds before processing it
    {"fault": "processing", "seconds": S, "lookup": "miss"|"processing"}
                                                    accept the request, commit its effect S seconds later

"processing" is how a real provider behaves when it queues work (a charge waiting for the card
network, a batch API): the POST is accepted and the effect commits ``S`` seconds later whether
or not the client is still connected (the client may time out or die; the commit is a timer of
the provider's own, and an ``accepted`` line in the state file makes it survive a provider
restart). Until then a re-send under the key gets 409 ``idempotency_key_in_use``, and a lookup
by the key answers as the provider's read side does: ``"miss"`` (the default) a 404, as from an
eventually consistent search index that has not seen the object yet, or ``"processing"`` a 202
``{"object": "idempotency_key", "status": "processing"}``. Either way the outcome is still open;
only a provider's declared processing window tells a client when a 404 becomes proof of absence
(docs/effects.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from secrets import token_hex
from typing import Any
from urllib.parse import parse_qs, urlsplit

# POST path -> resource; GET /v1/<resource> looks objects up.
RESOURCES = {"/v1/orders": "orders", "/v1/charges": "charges", "/v1/models/complete": "completions"}
ID_PREFIX = {"orders": "ord", "charges": "ch", "completions": "cmpl"}
FAULTS: tuple[str, ...] = ("commit_then_timeout", "5xx", "429", "decline", "lookup_disabled", "slow", "processing")
LOOKUP_WHILE_PROCESSING = ("miss", "processing")
DEFAULT_MODELS = ("m-small", "m-large")
# {"fault": "overbill"}: bill a completion 2 input tokens a prompt byte, more than any byte-level
# tokenizer can yield (a provider's billing bug). Completions otherwise bill what count_tokens counts.
FAULTS += ("overbill",)


@dataclass
class Fault:
    name: str
    resource: str | None = None  # None: every resource
    times: int | None = None  # requests left to affect; None: until reset
    seconds: float = 0.0
    status: int = 0
    retry_after: float = 1.0
    code: str = ""
    message: str = ""
    lookup: str = "miss"  # processing: what a lookup by key answers before the commit

    def applies(self, name: str, resource: str) -> bool:
        return self.name == name and self.resource in (None, resource) and (self.times is None or self.times > 0)


@dataclass
class Pending:
    """A request accepted for later processing: its object commits at ``commit_at``."""

    obj: dict[str, Any]
    lookup: str  # "miss" or "processing": how a lookup by key answers until then
    commit_at: float
    committed: threading.Event = field(default_factory=threading.Event)


class Reply(Exception):
    """An HTTP answer decided part-way through a request (carried out by the handler)."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


def error(status: int, kind: str, code: str, message: str, *, param: str = "") -> Reply:
    body: dict[str, Any] = {"error": {"type": kind, "code": code, "message": message}}
    if param:
        body["error"]["param"] = param
    return Reply(status, body)


def fingerprint(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# The pieces count_tokens prices: an ASCII word with its leading space, a digit (with its
# leading space), any other ASCII character, one non-ASCII character.
_TOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]|[^\x00-\x7f]|.", re.DOTALL)


def count_tokens(text: str) -> int:
    """Tokens a byte-level BPE tokenizer would bill for ``text``, deterministic and density-aware.

    ASCII words cost a token per 4 letters, every digit is its own token, a non-ASCII letter
    (é, 中) one token, any other non-ASCII character (emoji, symbols) one token per UTF-8
    byte (byte fallback), anything else one token. Like any byte-level tokenizer it never
    yields more tokens than the text has UTF-8 bytes.
    """
    tokens = 0
    for piece in _TOKEN.findall(text):
        if piece[-1].isascii() and piece[-1].isalpha():
            tokens += math.ceil(len(piece.lstrip()) / 4)
        elif piece.isascii() or piece.isalpha():
            tokens += 1
        else:
            tokens += len(piece.encode())
    return max(tokens, 1)


class ProviderState:
    """Objects, idempotency records, faults and counters, shared by the handler threads."""

    def __init__(self, state_file: Path, *, api_key: str = "", models: tuple[str, ...] = DEFAULT_MODELS) -> None:
        self.state_file = state_file
        self.api_key = api_key
        self.models = models
        self.lock = threading.Lock()
        self.stopping = threading.Event()  # ends every hold at shutdown
        self.objects: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in ID_PREFIX}
        self.by_key: dict[tuple[str, str], tuple[str, str]] = {}  # (resource, key) -> (fingerprint, object id)
        self.processing: set[tuple[str, str]] = set()
        # Accepted requests whose effect commits later (the processing fault): slot -> pending.
        self.pending: dict[tuple[str, str], Pending] = {}
        self.faults: list[Fault] = []
        self.in_flight: dict[str, int] = dict.fromkeys(ID_PREFIX, 0)
        self.max_in_flight: dict[str, int] = dict.fromkeys(ID_PREFIX, 0)
        self.in_flight_total = 0
        self.max_in_flight_total = 0
        self._load()

    # -- the durable record ------------------------------------------------------------------
    def _load(self) -> None:
        """A restarted provider still knows its objects (so lookups and replays keep working),
        and still commits what it accepted before it stopped."""
        accepted: dict[tuple[str, str], dict[str, Any]] = {}
        for event in read_events(self.state_file):
            if event.get("event") == "effect":
                obj = event["object"]
                self.objects[event["resource"]][obj["id"]] = obj
                if event.get("key"):
                    self.by_key[(event["resource"], event["key"])] = (event["fingerprint"], obj["id"])
                    accepted.pop((event["resource"], event["key"]), None)
            elif event.get("event") == "accepted":
                accepted[(event["resource"], event["key"])] = event
        for slot, event in accepted.items():
            self._accept(slot, event["fingerprint"], event["object"], at=event["commit_at"], lookup=event["lookup"])

    def append(self, **event: Any) -> None:
        event["at"] = time.time()
        line = (json.dumps(event, sort_keys=True) + "\n").encode()
        # One write per line with O_APPEND, then fsync: a line is whole and durable before we answer.
        fd = os.open(self.state_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- faults --------------------------------------------------------------------------------
    def take_fault(self, name: str, resource: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.applies(name, resource):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def lookup_disabled(self, resource: str) -> bool:
        """Whether this lookup answers 501 (a "times" fault counts the lookups it answers)."""
        return self.take_fault("lookup_disabled", resource) is not None

    def control(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("reset"):
            with self.lock:
                self.faults.clear()
                self.max_in_flight = dict(self.in_flight)
                self.max_in_flight_total = self.in_flight_total
            return self.stats()
        name = body.get("fault")
        if name not in FAULTS:
            raise error(400, "invalid_request_error", "unknown_fault", f"fault must be one of {', '.join(FAULTS)}")
        resource = body.get("resource")
        if resource is not None and resource not in ID_PREFIX:
            raise error(400, "invalid_request_error", "unknown_resource", f"resource must be one of {', '.join(ID_PREFIX)}")
        if body.get("lookup", "miss") not in LOOKUP_WHILE_PROCESSING:
            raise error(400, "invalid_request_error", "unknown_lookup", "lookup must be 'miss' or 'processing'")
        fields = {k: body[k] for k in ("times", "seconds", "status", "retry_after", "code", "message", "lookup") if k in body}
        fault = Fault(name=name, resource=resource, **fields)
        if name == "5xx" and not fault.status:
            fault.status = 503
        if name == "decline":
            fault.status = fault.status or 402
            fault.code = fault.code or "card_declined"
            fault.message = fault.message or "Your card was declined."
        with self.lock:
            self.faults.append(fault)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "in_flight": dict(self.in_flight),
                "max_in_flight": dict(self.max_in_flight),
                "in_flight_total": self.in_flight_total,
                "max_in_flight_total": self.max_in_flight_total,
                "faults": [asdict(f) for f in self.faults],
            }

    def enter(self, resource: str) -> None:
        with self.lock:
            self.in_flight[resource] += 1
            self.in_flight_total += 1
            self.max_in_flight[resource] = max(self.max_in_flight[resource], self.in_flight[resource])
            self.max_in_flight_total = max(self.max_in_flight_total, self.in_flight_total)

    def leave(self, resource: str) -> None:
        with self.lock:
            self.in_flight[resource] -= 1
            self.in_flight_total -= 1

    # -- the API -------------------------------------------------------------------------------
    def create(self, resource: str, key: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool, float, Pending | None]:
        """Perform one POST: (object, replayed?, seconds to hold the reply after committing, and
        the pending commit to wait for when the request was accepted for later processing)."""
        # A rate limiter and a failing front end answer before the request reaches the API.
        fault = self.take_fault("429", resource)
        if fault is not None:
            reply = error(429, "rate_limit_error", "rate_limited", "Too many requests; retry later.")
            reply.headers["Retry-After"] = f"{fault.retry_after:g}"
            raise reply
        fault = self.take_fault("5xx", resource)
        if fault is not None:
            raise error(fault.status, "api_error", "internal_error", fault.message or "Something went wrong on our side.")
        digest = fingerprint(body)
        slot = (resource, key)
        with self.lock:
            if key and slot in self.processing:
                raise error(409, "idempotency_error", "idempotency_key_in_use", "A request with this key is in progress.")
            if key and slot in self.by_key:
                stored_digest, object_id = self.by_key[slot]
                if stored_digest != digest:
                    raise error(
                        422,
                        "idempotency_error",
                        "idempotency_key_reused",
                        "Keys for idempotent requests can only be used with the same parameters they were first used with.",
                    )
                return self.objects[resource][object_id], True, 0.0, None
            if key:
                self.processing.add(slot)
        accepted = False
        try:
            slow = self.take_fault("slow", resource)
            if slow is not None:
                self.stopping.wait(slow.seconds)
            decline = self.take_fault("decline", resource)
            if decline is not None:
                raise error(decline.status, "card_error", decline.code, decline.message)
            obj = self._build(resource, body)  # a bad request is refused now, never accepted
            later = self.take_fault("processing", resource) if key else None
            if later is not None:
                commit_at = time.time() + later.seconds
                # Durable before the answer, like the effect itself: a restart still commits it.
                self.append(
                    event="accepted",
                    resource=resource,
                    key=key,
                    fingerprint=digest,
                    object=obj,
                    commit_at=commit_at,
                    lookup=later.lookup,
                )
                pending = self._accept(slot, digest, obj, at=commit_at, lookup=later.lookup)
                accepted = True
                return obj, False, 0.0, pending
            with self.lock:
                # The effect: stored, written to the durable record, then answered.
                self.objects[resource][obj["id"]] = obj
                if key:
                    self.by_key[slot] = (digest, obj["id"])
                self.append(event="effect", resource=resource, key=key, fingerprint=digest, object=obj)
        finally:
            if not accepted:  # an accepted request keeps its key in use until its commit
                with self.lock:
                    self.processing.discard(slot)
        hold = self.take_fault("commit_then_timeout", resource)
        return obj, False, hold.seconds if hold is not None else 0.0, None

    def _accept(self, slot: tuple[str, str], digest: str, obj: dict[str, Any], *, at: float, lookup: str) -> Pending:
        """Commit ``obj`` under ``slot`` at time ``at`` on the provider's own timer: the client's
        connection (or its whole process) may be gone by then, the effect happens anyway."""
        pending = Pending(obj=obj, lookup=lookup, commit_at=at)
        with self.lock:
            self.processing.add(slot)
            self.pending[slot] = pending
        timer = threading.Timer(max(at - time.time(), 0.0), self._commit, args=(slot, digest))
        timer.daemon = True
        timer.start()
        return pending

    def _commit(self, slot: tuple[str, str], digest: str) -> None:
        with self.lock:
            pending = self.pending.pop(slot, None)
            if pending is None:
                return
            resource, key = slot
            self.objects[resource][pending.obj["id"]] = pending.obj
            self.by_key[slot] = (digest, pending.obj["id"])
            self.append(event="effect", resource=resource, key=key, fingerprint=digest, object=pending.obj)
            self.processing.discard(slot)
        pending.committed.set()

    def processing_state(self, resource: str, key: str) -> str | None:
        """What a lookup answers for a key accepted but not yet committed (None: not pending)."""
        with self.lock:
            pending = self.pending.get((resource, key))
            return pending.lookup if pending is not None else None

    def _build(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": f"{ID_PREFIX[resource]}_{token_hex(8)}", "created": int(time.time())}
        if resource in ("orders", "charges"):
            amount = body.get("amount_minor")
            if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
                raise error(
                    400,
                    "invalid_request_error",
                    "parameter_invalid",
                    "amount_minor must be a positive integer.",
                    param="amount_minor",
                )
            currency = body.get("currency")
            if not (isinstance(currency, str) and len(currency) == 3 and currency.isalpha() and currency.isupper()):
                raise error(
                    400, "invalid_request_error", "parameter_invalid", "currency must be 3 capital letters.", param="currency"
                )
            description = body.get("description", "")
            obj.update(amount_minor=amount, currency=currency, description=description)
        if resource == "orders":
            reference = body.get("reference")
            if not isinstance(reference, str) or not reference:
                raise error(400, "invalid_request_error", "parameter_missing", "reference is required.", param="reference")
            obj.update(object="order", reference=reference, status="created")
        elif resource == "charges":
            order = body.get("order")
            with self.lock:
                known = isinstance(order, str) and order in self.objects["orders"]
            if not known:
                raise error(404, "invalid_request_error", "resource_missing", f"No such order: {order!r}", param="order")
            # Like a real provider, the answer carries more than the client should keep (a client secret).
            obj.update(
                object="charge", order=order, status="succeeded", paid=True, client_secret=f"{obj['id']}_secret_{token_hex(12)}"
            )
        elif resource == "completions":
            model, prompt = body.get("model"), body.get("prompt")
            if model not in self.models:
                raise error(
                    404, "invalid_request_error", "model_not_found", f"The model {model!r} does not exist.", param="model"
                )
            if not isinstance(prompt, str) or not prompt:
                raise error(400, "invalid_request_error", "parameter_missing", "prompt is required.", param="prompt")
            max_tokens = body.get("max_tokens", 64)
            if not isinstance(max_tokens, int) or not 1 <= max_tokens <= 4096:
                raise error(400, "invalid_request_error", "parameter_invalid", "max_tokens must be 1..4096.", param="max_tokens")
            # Deterministic token counts by density (count_tokens), so tests can price them exactly.
            input_tokens = count_tokens(prompt)
            if self.take_fault("overbill", resource) is not None:
                input_tokens = 2 * len(prompt.encode())
            output_tokens = min(max_tokens, 8 + input_tokens // 2)
            obj.update(
                object="completion",
                model=model,
                output=f"[{model}] {output_tokens} tokens of completion",
                usage={"input_tokens": input_tokens, "output_tokens": output_tokens},
            )
        return obj

    def lookup(self, resource: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.by_key.get((resource, key))
            return self.objects[resource][found[1]] if found else None

    def get(self, resource: str, object_id: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects[resource].get(object_id)


class Handler(BaseHTTPRequestHandler):
    server: ProviderHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout we caused on purpose): the effect stands
        self.close_connection = True

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise error(400, "invalid_request_error", "invalid_json", "The body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise error(400, "invalid_request_error", "invalid_json", "The body must be a JSON object.")
        return body

    def _authorize(self) -> None:
        state = self.server.state
        if state.api_key and self.headers.get("Authorization") != f"Bearer {state.api_key}":
            raise error(401, "authentication_error", "unauthorized", "Invalid API key provided.")

    # -- routes --------------------------------------------------------------------------------
    def do_GET(self) -> None:
        state = self.server.state
        url = urlsplit(self.path)
        try:
            if url.path == "/_control":
                self._send(200, state.stats())
                return
            self._authorize()
            parts = url.path.strip("/").split("/")
            if len(parts) < 2 or parts[0] != "v1" or parts[1] not in ID_PREFIX or len(parts) > 3:
                raise error(404, "invalid_request_error", "unknown_path", f"Unrecognized request URL: {url.path}")
            resource = parts[1]
            if len(parts) == 3:
                obj = state.get(resource, parts[2])
                if obj is None:
                    raise error(404, "invalid_request_error", "resource_missing", f"No such {resource[:-1]}")
                self._send(200, obj)
                return
            key = (parse_qs(url.query).get("idempotency_key") or [""])[0]
            if not key:
                raise error(400, "invalid_request_error", "parameter_missing", "idempotency_key is required.")
            if state.lookup_disabled(resource):
                state.append(event="lookup", resource=resource, key=key, status=501)
                raise error(501, "api_error", "not_implemented", "Lookup by idempotency key is not supported.")
            obj = state.lookup(resource, key)
            if obj is None and state.processing_state(resource, key) == "processing":
                state.append(event="lookup", resource=resource, key=key, status=202)
                self._send(202, {"object": "idempotency_key", "key": key, "status": "processing"})
                return
            state.append(event="lookup", resource=resource, key=key, status=200 if obj else 404)
            if obj is None:
                raise error(404, "invalid_request_error", "resource_missing", "No object was created with this idempotency key.")
            self._send(200, obj)
        except Reply as reply:
            self._send(reply.status, reply.body, reply.headers)

    def do_POST(self) -> None:
        state = self.server.state
        path = urlsplit(self.path).path
        if path == "/_control":
            try:
                self._send(200, state.control(self._body()))
            except Reply as reply:
                self._send(reply.status, reply.body, reply.headers)
            return
        resource = RESOURCES.get(path)
        if resource is None:
            self._send(404, error(404, "invalid_request_error", "unknown_path", f"Unrecognized request URL: {path}").body)
            return
        key = self.headers.get("Idempotency-Key", "")
        state.enter(resource)
        status, outcome = 500, "error"
        try:
            self._authorize()
            obj, replayed, hold, pending = state.create(resource, key, self._body())
            status, outcome = 200, "replayed" if replayed else ("accepted" if pending else "created")
            state.append(event="request", resource=resource, key=key, status=status, outcome=outcome)
            if pending is not None:
                # Answer when the effect commits, as a synchronous API over queued work does; a
                # client whose timeout is shorter never hears it (the effect commits regardless).
                while not pending.committed.wait(0.05) and not state.stopping.is_set():
                    pass
            if hold:
                # "Commit then time out": the effect is durable; the reply comes too late for the client.
                state.stopping.wait(hold)
            answer: tuple[int, dict[str, Any], dict[str, str] | None] = (
                200,
                obj,
                {"Idempotent-Replayed": "true"} if replayed else None,
            )
        except Reply as reply:
            status, outcome = reply.status, reply.body.get("error", {}).get("code", "error")
            state.append(event="request", resource=resource, key=key, status=status, outcome=outcome)
            answer = (reply.status, reply.body, reply.headers)
        finally:
            # Out of flight before the client hears the answer: a client holding its reply must never
            # read its own request as still in flight in the stats.
            state.leave(resource)
        self._send(*answer)


class ProviderHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a held request (commit then time out) must not delay shutdown

    def __init__(self, port: int, state: ProviderState, *, verbose: bool = False, host: str = "127.0.0.1") -> None:
        self.state = state
        self.verbose = verbose
        super().__init__((host, port), Handler)


# -- reading the record and steering the provider, from any process ------------------------------
def read_events(state_file: Path) -> list[dict[str, Any]]:
    try:
        with open(state_file) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


class ProviderControl:
    """What a test needs from a provider, whichever process runs it: faults, effects, counters."""

    def __init__(self, url: str, state_file: Path) -> None:
        self.url = url.rstrip("/")
        self.state_file = Path(state_file)

    def _control(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/_control", data=data, method="POST" if data else "GET", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"provider control refused {body}: {exc.read().decode()}") from None

    def fault(self, name: str, **params: Any) -> None:
        self._control({"fault": name, **params})

    def reset(self) -> None:
        """Clear every fault and start the in-flight maxima afresh."""
        self._control({"reset": True})

    def stats(self) -> dict[str, Any]:
        return self._control()

    def events(self, event: str, resource: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in read_events(self.state_file)
            if e["event"] == event and resource in (None, e["resource"]) and key in (None, e.get("key"))
        ]

    def effects(self, resource: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        """Objects created (the outside world's count of effects)."""
        return [e["object"] for e in self.events("effect", resource, key)]

    def requests(self, resource: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        """Every POST received (a replay or a refused request counts here, not in effects)."""
        return self.events("request", resource, key)

    def lookups(self, resource: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        return self.events("lookup", resource, key)

    def accepted(self, resource: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        """Requests accepted for later processing (the processing fault): each commits later."""
        return self.events("accepted", resource, key)


class FakeProvider(ProviderControl):
    """The provider in a thread of this process (the pytest fixture's way)."""

    def __init__(
        self, state_file: Path, *, api_key: str = "", port: int = 0, verbose: bool = False, host: str = "127.0.0.1"
    ) -> None:
        self.state = ProviderState(Path(state_file), api_key=api_key)
        self.server = ProviderHTTPServer(port, self.state, verbose=verbose, host=host)
        super().__init__(f"http://{host}:{self.server.server_address[1]}", state_file)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> FakeProvider:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.state.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A payment provider and model API on 127.0.0.1 for tests and the demo.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    parser.add_argument("--state", type=Path, required=True, help="JSON-lines record of every effect (kept across restarts)")
    parser.add_argument(
        "--api-key", default=os.environ.get("FAKE_PROVIDER_API_KEY", ""), help="require 'Authorization: Bearer KEY'"
    )
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    # Another address only inside a private network namespace (tests/support/netns.py): the
    # provider stays a loopback-only tool on the machine's own network.
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    args = parser.parse_args(argv)
    provider = FakeProvider(args.state, api_key=args.api_key, port=args.port, verbose=args.verbose, host=args.host)

    def stop(signum: int, frame: Any) -> None:
        # shutdown() waits for serve_forever, so it cannot run on the serving (main) thread.
        provider.state.stopping.set()
        threading.Thread(target=provider.server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"provider listening on {provider.url} (state {args.state})", flush=True)
    provider.server.serve_forever(poll_interval=0.05)
    provider.server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
