"""A Sentry ingest endpoint on 127.0.0.1 that keeps every envelope the real SDK sends.

    sentry = FakeSentry().start()
    env["SENTRY_DSN"] = sentry.dsn            # http://key@127.0.0.1:PORT/1
    ...
    events = sentry.wait_for_events(1)
    assert secret not in sentry.raw()          # every byte the SDK sent, decompressed

A real HTTP server (stdlib ``ThreadingHTTPServer``): ``sentry_sdk``'s transport posts its
envelopes to ``POST /api/<project>/envelope/``, gzip-compressed, exactly as to sentry.io. The
server decompresses each body, keeps it whole (so a test can search every byte that left the
process) and parses the envelope: one JSON header line, then items of a JSON header line and a
payload of the header's ``length`` bytes (or up to the next newline). Items of type ``event``
and ``transaction`` are decoded to dicts.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def parse_envelope(body: bytes) -> tuple[dict[str, Any], list[tuple[dict[str, Any], bytes]]]:
    """The envelope's header and its (item header, payload) pairs."""
    header_line, _, rest = body.partition(b"\n")
    header = json.loads(header_line) if header_line.strip() else {}
    items: list[tuple[dict[str, Any], bytes]] = []
    while rest.strip():
        item_line, _, rest = rest.partition(b"\n")
        if not item_line.strip():
            continue
        item = json.loads(item_line)
        length = item.get("length")
        if length is None:
            payload, _, rest = rest.partition(b"\n")
        else:
            payload, rest = rest[:length], rest[length:]
            rest = rest[1:] if rest.startswith(b"\n") else rest
        items.append((item, payload))
    return header, items


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        try:
            if encoding == "gzip" or body[:2] == b"\x1f\x8b":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding == "br":  # the SDK prefers brotli when it is installed; keep it honest
                raise ValueError("brotli envelopes are not supported by this fake")
            if not self.path.rstrip("/").endswith("/envelope"):
                raise ValueError(f"unexpected path {self.path}")
            header, items = parse_envelope(body)
        except Exception as exc:
            self.server.sink.record_error(f"{self.path}: {exc}")
            self._answer(400, {"detail": str(exc)})
            return
        self.server.sink.record(self.path, self.headers.get("Content-Encoding") or "", body, header, items)
        self._answer(200, {"id": header.get("event_id", "")})

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the test reads the envelopes, not an access log


class _Sink:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.envelopes: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def record(self, path: str, encoding: str, body: bytes, header: dict[str, Any], items: list[tuple[dict, bytes]]) -> None:
        with self.lock:
            self.envelopes.append({"path": path, "encoding": encoding, "body": body, "header": header, "items": items})

    def record_error(self, error: str) -> None:
        with self.lock:
            self.errors.append(error)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, sink: _Sink) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.sink = sink


class FakeSentry:
    """The ingest endpoint in a thread of this process; worker and web subprocesses reach it over TCP."""

    def __init__(self, *, port: int = 0, project: int = 1) -> None:
        self.sink = _Sink()
        self.server = _Server(port, self.sink)
        self.project = project
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def dsn(self) -> str:
        return f"http://fakepublickey@127.0.0.1:{self.port}/{self.project}"

    def start(self) -> FakeSentry:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    # -- what arrived -------------------------------------------------------------------------
    def raw(self) -> bytes:
        """Every decompressed envelope body received so far, concatenated."""
        with self.sink.lock:
            return b"\n".join(e["body"] for e in self.sink.envelopes)

    def encodings(self) -> list[str]:
        with self.sink.lock:
            return [e["encoding"] for e in self.sink.envelopes]

    def events(self) -> list[dict[str, Any]]:
        """Decoded ``event`` items (errors and messages), in arrival order."""
        with self.sink.lock:
            items = [item for e in self.sink.envelopes for item in e["items"]]
        return [json.loads(payload) for header, payload in items if header.get("type") == "event"]

    def errors(self) -> list[str]:
        with self.sink.lock:
            return list(self.sink.errors)

    def wait_for_events(self, count: int = 1, *, timeout: float = 20.0, where: Any = None) -> list[dict[str, Any]]:
        """At least ``count`` events (those ``where(event)`` accepts, if given), or AssertionError."""
        deadline = time.monotonic() + timeout
        while True:
            events = [e for e in self.events() if where is None or where(e)]
            if len(events) >= count:
                return events
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(events)} of {count} Sentry events arrived in {timeout}s "
                    f"({len(self.events())} events in all, errors: {self.errors()})"
                )
            time.sleep(0.05)
