"""JSON over HTTP to a provider that honours an ``Idempotency-Key`` header.

The error class of a failed call follows from how far the request got, because that alone
tells the ledger whether sending it again could repeat the effect:

- nothing left this machine (DNS failure, connection refused, connect timeout, TLS handshake
  failure) → ``NotPerformed``: the ledger re-sends on the retry;
- 429 (``Retry-After`` honoured) → ``NotPerformed(retry_after=…)``: re-sent later under the same key;
- read timeout, connection reset or closed after sending, 5xx, an unreadable 2xx, and 409 "key
  in use" (another request under this key is still being processed there, and may well take
  effect) → ``OutcomeUnknown``: the ledger reconciles by key before anything is sent again;
- any other 4xx (invalid request, declined, unknown object, bad credentials, key reused with
  other parameters) → ``Declined``: the job fails terminally.

The provider contract (docs/effects.md) adds a processing window: ``processing_window``, the
longest a request the provider received can take to show in a lookup by key. A lookup that
misses (404) is returned as ``Miss(window)``, not as proof: the ledger counts it as absence only
once the last send is older than the window. A lookup answering "processing" (202, or 409 key in
use) is ``Processing(window)``: the outcome is open.

Timeouts are explicit: ``connect_timeout`` for the TCP/TLS handshake, ``timeout`` for each
read after the request is sent. The API key travels only in the ``Authorization`` header and
never appears in an exception message (Koala stores those, redacted, in its records).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlsplit

from koala import redaction
from workers import Declined, Miss, NotPerformed, OutcomeUnknown, Processing

MAX_PROVIDER_MESSAGE = 300  # characters of a provider's error message kept in ours

# Failed calls are logged here, their messages masked first (provider messages may echo secrets).
log = logging.getLogger("koala.providers")


@dataclass(frozen=True)
class Endpoint:
    name: str  # "payments", "models": names the provider in messages
    base_url: str
    api_key: str
    timeout: float  # seconds per read once the request is sent
    connect_timeout: float  # seconds for the TCP (and TLS) handshake
    # The provider's processing window (seconds): how long after receiving a request a lookup
    # by its key may still miss it. Generous by default: a miss is proof only after it.
    processing_window: float = 60.0


def _masked(exc: Exception) -> str:
    """A failed call's message (status, class and the provider's text, which may echo what the job
    sent) masked with the attempt's redaction context before it is logged: the record never holds
    it raw, whatever handlers (with or without Koala's filter) a deployment attaches."""
    return redaction.current().text(str(exc), limit=MAX_PROVIDER_MESSAGE + 200)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, IndexError):
        return None


class JsonClient:
    def __init__(self, endpoint: Endpoint) -> None:
        url = urlsplit(endpoint.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{endpoint.name}: the base URL must be http(s)://host[:port][/prefix]")
        self.endpoint = endpoint
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._prefix = url.path.rstrip("/")

    # -- the two calls a kind makes --------------------------------------------------------------
    def post(self, path: str, body: dict[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        """Create something at the provider; returns the object it answered with."""
        try:
            return self._post(path, body, idempotency_key=idempotency_key)
        except (NotPerformed, OutcomeUnknown, Declined) as exc:
            log.warning("%s (%s)", _masked(exc), type(exc).__name__)
            raise

    def _post(self, path: str, body: dict[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        status, headers, answer = self._exchange("POST", path, body=body, idempotency_key=idempotency_key)
        what = f"{self.endpoint.name} POST {path}"
        if 200 <= status < 300:
            if not isinstance(answer, dict):
                # It said yes but we cannot read what it created: we do not know its id.
                raise OutcomeUnknown(f"{what}: HTTP {status} with an unreadable body; the effect may have happened")
            return answer
        detail = _provider_error(answer)
        if status == 429:
            raise NotPerformed(
                f"{what}: rate limited (HTTP 429){detail}", retry_after=retry_after_seconds(headers.get("retry-after"))
            )
        if status == 409:
            # Another request with this key is still being processed there (ours, sent before a
            # crash or a timeout, or a concurrent one): it may well take effect. Not "not performed".
            raise OutcomeUnknown(f"{what}: HTTP 409{detail}; a request under this key is still being processed")
        if status >= 500:
            raise OutcomeUnknown(f"{what}: HTTP {status}{detail}; the effect may have happened")
        raise Declined(f"{what}: HTTP {status}{detail}")

    def lookup(self, path: str, *, key: str) -> dict[str, Any] | Miss | Processing | None:
        """What reconcile needs: the object created under ``key`` (200); ``Miss`` when the provider
        has none now (404: proof of absence only past the processing window, the ledger decides);
        ``Processing`` when it says the key is still being worked on (202, 409); None when it
        cannot tell (it has no lookup: 501).

        A lookup that itself fails (timeout, 5xx, refused) raises the ledger's classes above, so
        the job is retried and reconciles later instead of waiting for a person over a blip.
        """
        query = f"{path}?idempotency_key={quote(key, safe='')}"
        try:
            status, _, answer = self._exchange("GET", query, body=None, idempotency_key="")
        except (NotPerformed, OutcomeUnknown) as exc:
            log.warning("lookup failed: %s (%s)", _masked(exc), type(exc).__name__)
            raise
        window = self.endpoint.processing_window
        if status == 200 and isinstance(answer, dict):
            return answer
        if status in (202, 409):
            return Processing(window)
        if status == 404:
            return Miss(window)
        if status == 501:
            return None
        if status == 429:
            raise NotPerformed(f"{self.endpoint.name} GET {path}: rate limited (HTTP 429)")
        raise OutcomeUnknown(f"{self.endpoint.name} GET {path}: HTTP {status}{_provider_error(answer)}")

    # -- transport ---------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self.endpoint.connect_timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self.endpoint.connect_timeout)

    def _exchange(
        self, method: str, path: str, *, body: dict[str, Any] | None, idempotency_key: str
    ) -> tuple[int, dict[str, str], Any]:
        name = self.endpoint.name
        headers = {"Accept": "application/json", "User-Agent": "koala-worker"}
        if self.endpoint.api_key:
            headers["Authorization"] = f"Bearer {self.endpoint.api_key}"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        payload = None
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection()
        try:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                # Covers refused, unreachable, DNS, connect timeout and TLS handshake: no byte of
                # the request was sent, so nothing can have happened at the provider.
                raise NotPerformed(f"{name}: could not connect ({_describe(exc)}); nothing was sent") from None
            if conn.sock is not None:
                conn.sock.settimeout(self.endpoint.timeout)
            try:
                conn.request(method, f"{self._prefix}{path}", body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                # Sent (at least in part) and no answer: the provider may have acted on it.
                raise OutcomeUnknown(
                    f"{name} {method} {path.split('?', 1)[0]}: {_describe(exc)} after the request was sent; "
                    "the effect may have happened"
                ) from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        return response.status, {k.lower(): v for k, v in response.getheaders()}, answer


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, socket.gaierror):
        return "host not found"
    if isinstance(exc, ssl.SSLError):
        return "TLS failure"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed without an answer"
    return type(exc).__name__


def _provider_error(answer: Any) -> str:
    """`` (code): message`` from a Stripe-style error body, bounded; empty when there is none."""
    if not isinstance(answer, dict) or not isinstance(answer.get("error"), dict):
        return ""
    err = answer["error"]
    code = str(err.get("code") or err.get("type") or "")
    message = str(err.get("message") or "")[:MAX_PROVIDER_MESSAGE]
    return f" ({code}): {message}" if code else f": {message}"
