"""A client of the worker protocol's calls: one method per call, typed errors, standard library only.

Each thread keeps its own keep-alive connection (``http.client`` connections are not shared
between threads), so a worker's heartbeat thread, its acquire loop and its bodies' reports do
not queue behind one another.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from koala_worker.errors import ApiError, Reason, Rejected, Unavailable
from koala_worker.lease import HeartbeatAnswer, Lease, Registration, StopAnswer, parse_leases

SDK = "koala-worker-python/0.1"
# A kept-alive connection idle longer than this is dropped before use: servers close idle
# connections (uvicorn after 5 s), and a request sent on a socket the server is closing fails
# without saying whether it arrived.
IDLE_REUSE_SECONDS = 2.0


class _Conn:
    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.used_at = 0.0


class Client:
    """``Client("http://koala:8000", "kk_…")``. Methods raise ``Rejected`` (a 409, by reason) or ``ApiError``."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._by_thread: dict[int, _Conn] = {}

    # -- transport -------------------------------------------------------------------------

    def _connection(self, timeout: float) -> tuple[_Conn, bool]:
        held: _Conn | None = getattr(self._local, "conn", None)
        if held is not None and time.monotonic() - held.used_at > IDLE_REUSE_SECONDS:
            held.conn.close()
            held = None
        reused = held is not None
        if held is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            held = _Conn(cls(self._host, self._port, timeout=timeout))
            self._local.conn = held
            with self._lock:
                self._by_thread[threading.get_ident()] = held
        held.conn.timeout = timeout
        if held.conn.sock is not None:
            held.conn.sock.settimeout(timeout)
        return held, reused

    def _drop_connection(self) -> None:
        held: _Conn | None = getattr(self._local, "conn", None)
        if held is not None:
            held.conn.close()
        self._local.conn = None
        with self._lock:
            self._by_thread.pop(threading.get_ident(), None)

    def close(self) -> None:
        """Close this thread's connection."""
        self._drop_connection()

    def abort(self, thread_ident: int) -> None:
        """Cut the connection another thread is waiting on (a long-poll, at shutdown)."""
        with self._lock:
            held = self._by_thread.get(thread_ident)
        if held is not None and held.conn.sock is not None:
            try:
                held.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        retry_stale: bool = True,
    ) -> tuple[int, Any]:
        """One call: ``(status, parsed JSON or None)`` for a 2xx, else raises Rejected/ApiError."""
        payload = None if body is None else json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        headers = {"Authorization": f"Bearer {self._api_key}", "Accept": "application/json", "User-Agent": SDK}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        wait = self.timeout if timeout is None else timeout
        for again in (True, False):
            held, reused = self._connection(wait)
            try:
                held.conn.request(method, self._prefix + path, body=payload, headers=headers)
                answer = held.conn.getresponse()
                raw = answer.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                # A kept-alive socket the server had just closed: the request never reached a
                # handler. Every call but acquire is safe to repeat (Koala answers a repeated
                # report already_recorded), so send it once more on a fresh connection.
                stale = isinstance(exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError)
                if again and reused and retry_stale and stale:
                    continue
                raise Unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            held.used_at = time.monotonic()
            if answer.getheader("Connection", "").lower() == "close":
                self._drop_connection()
            return _answer(method, path, answer.status, answer.getheader("Retry-After"), raw)
        raise AssertionError("unreachable")

    # -- the calls -------------------------------------------------------------------------

    def register(
        self,
        *,
        kinds: list[dict[str, Any]],
        concurrency: int,
        name: str | None = None,
        hostname: str | None = None,
        pid: int | None = None,
        queues: list[str] | None = None,
        sdk: str = SDK,
    ) -> Registration:
        body: dict[str, Any] = {"kinds": kinds, "concurrency": concurrency, "sdk": sdk}
        for key, value in (("name", name), ("hostname", hostname), ("pid", pid), ("queues", queues)):
            if value is not None:
                body[key] = value
        _, answer = self.request("POST", "/api/v1/workers/register", body)
        return Registration.parse(answer)

    def acquire(self, worker_id: str, *, max: int, wait_seconds: float) -> list[Lease]:
        """Long-poll for up to ``max`` leases; ``[]`` when ``wait_seconds`` passed with nothing due."""
        status, answer = self.request(
            "POST",
            f"/api/v1/workers/{urllib.parse.quote(worker_id, safe='')}/acquire",
            {"max": max, "wait_seconds": wait_seconds},
            timeout=wait_seconds + self.timeout,
            # Not repeated blindly: a lost answer holds leases nobody works on until they expire.
            retry_stale=False,
        )
        if status == 204 or answer is None:
            return []
        return parse_leases(answer)

    def stop(self, worker_id: str, *, reason: str = "") -> StopAnswer:
        """This worker stops: Koala answers its open acquire at once (with no lease) and records its
        exit once it holds no lease (``exited``); call again after the last body ended."""
        body = {"reason": reason} if reason else {}
        _, answer = self.request("POST", f"/api/v1/workers/{urllib.parse.quote(worker_id, safe='')}/stop", body)
        answer = answer if isinstance(answer, dict) else {}
        return StopAnswer(held=int(answer.get("held") or 0), exited=bool(answer.get("exited")))

    def _lease_call(self, lease: Lease, what: str, worker_id: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        payload = {"worker_id": worker_id, "lease_token": lease.lease_token, **body}
        _, answer = self.request("POST", f"/api/v1/leases/{lease.lease_id}/{what}", payload, timeout=timeout)
        return answer

    def heartbeat(self, worker_id: str, lease: Lease, *, progress: dict[str, Any] | None = None) -> HeartbeatAnswer:
        body: dict[str, Any] = {} if progress is None else {"progress": progress}
        # A heartbeat that takes longer than the interval is already late: do not wait for it past that.
        timeout = min(self.timeout, max(lease.heartbeat_seconds, 1.0))
        return HeartbeatAnswer.parse(self._lease_call(lease, "heartbeat", worker_id, body, timeout))

    def complete(
        self,
        worker_id: str,
        lease: Lease,
        *,
        output: Any,
        state_delta: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        spans: list[dict[str, Any]] | None = None,
        duration_seconds: float | None = None,
    ) -> str:
        body: dict[str, Any] = {"output": output}
        if duration_seconds is not None:
            body["duration_seconds"] = round(max(0.0, duration_seconds), 6)
        if state_delta:
            body["state_delta"] = state_delta
        if usage:
            body["usage"] = usage
        if spans:
            body["spans"] = spans
        return str((self._lease_call(lease, "complete", worker_id, body) or {}).get("outcome", ""))

    def fail(
        self,
        worker_id: str,
        lease: Lease,
        *,
        classification: str,
        error_class: str = "",
        message: str = "",
        retry_after: float | None = None,
        body_started: bool | None = None,
        safe_point: bool | None = None,
        spans: list[dict[str, Any]] | None = None,
    ) -> str:
        body: dict[str, Any] = {"classification": classification, "error_class": error_class, "message": message}
        if spans:
            body["spans"] = spans
        if retry_after is not None:
            body["retry_after"] = retry_after
        if body_started is not None:
            body["body_started"] = body_started
        if safe_point is not None:
            body["safe_point"] = safe_point
        return str((self._lease_call(lease, "fail", worker_id, body) or {}).get("outcome", ""))

    def begin_operation(
        self,
        worker_id: str,
        lease: Lease,
        *,
        name: str,
        kind: str,
        params: dict[str, Any],
        amount_minor: int | None = None,
        currency: str = "",
        target: str = "",
        estimate_minor: int = 0,
        key: str | None = None,
        can_look_up: bool = False,
        lookup: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = {
            "name": name,
            "kind": kind,
            "params": params,
            "amount_minor": amount_minor,
            "currency": currency,
            "target": target,
            "estimate_minor": estimate_minor,
            "key": key,
            "can_look_up": can_look_up,
            "lookup": lookup,
        }
        answer = self._lease_call(lease, "operations", worker_id, body)
        if not isinstance(answer, dict):
            raise ApiError(200, "bad_answer", "an operation answer must be an object")
        return answer

    def settle_operation(
        self,
        worker_id: str,
        lease: Lease,
        operation_id: int,
        *,
        outcome: str,
        external_id: str = "",
        data: dict[str, Any] | None = None,
        cost_minor: int | None = None,
        usage: dict[str, Any] | None = None,
        message: str = "",
        retry_after: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "outcome": outcome,
            "external_id": external_id,
            "data": data or {},
            "cost_minor": cost_minor,
            "usage": usage,
        }
        if message:
            body["message"] = message
        if retry_after is not None:
            body["retry_after"] = retry_after
        answer = self._lease_call(lease, f"operations/{operation_id}", worker_id, body)
        if not isinstance(answer, dict):
            raise ApiError(200, "bad_answer", "an operation answer must be an object")
        return answer

    # -- workflow runs (a key with the execute scope) ------------------------------------------

    def start_run(
        self,
        definition: str,
        input: dict[str, Any] | None = None,
        *,
        version: int | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
    ) -> dict[str, Any]:
        """Start a run of ``definition`` (its newest version unless ``version``): ``{"run_id",
        "definition", "version", "state", "created"}``; ``created`` is False when
        ``idempotency_key`` names an earlier run with the same input."""
        body: dict[str, Any] = {"definition": definition, "input": input or {}}
        for key, value in (("version", version), ("idempotency_key", idempotency_key), ("correlation_id", correlation_id)):
            if value is not None:
                body[key] = value
        return _object(self.request("POST", "/api/v1/runs", body)[1])

    def get_run(self, run_id: int) -> dict[str, Any]:
        """The run: its state, version, run state, and its steps (state, output, worker ids)."""
        return _object(self.request("GET", f"/api/v1/runs/{int(run_id)}")[1])

    def signal(self, run_id: int, name: str, *, key: str, payload: dict[str, Any] | None = None) -> str:
        """Send signal ``name`` (deduplicated by ``key``): ``resumed``, ``buffered``, ``duplicate`` or ``rejected``."""
        body = {"name": name, "key": key, "payload": payload or {}}
        return str(_object(self.request("POST", f"/api/v1/runs/{int(run_id)}/signals", body)[1]).get("outcome", ""))

    def cancel_run(self, run_id: int, *, reason: str = "") -> dict[str, Any]:
        """Cancel a live run (its running steps hear ``job_cancelled`` at their next heartbeat)."""
        body = {"reason": reason} if reason else {}
        return _object(self.request("POST", f"/api/v1/runs/{int(run_id)}/cancel", body)[1])


def _object(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise ApiError(200, "bad_answer", "the answer must be a JSON object")
    return answer


def _retry_after(header: str | None) -> float | None:
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        return None  # an HTTP date: rare enough to fall back to the backoff


def _answer(method: str, path: str, status: int, retry_after: str | None, raw: bytes) -> tuple[int, Any]:
    parsed: Any = None
    if raw:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
    if 200 <= status < 300:
        if raw and parsed is None:
            raise ApiError(status, "bad_answer", f"{method} {path}: the answer is not JSON")
        return status, parsed
    code = parsed.get("error") if isinstance(parsed, dict) else None
    message = parsed.get("message") if isinstance(parsed, dict) else None
    if not isinstance(message, str):
        message = raw[:200].decode("utf-8", "replace")
    if status == 409 and isinstance(code, str) and code in Reason._value2member_map_:
        raise Rejected.of(code, message)
    raise ApiError(status, code if isinstance(code, str) else f"http_{status}", message, retry_after=_retry_after(retry_after))
