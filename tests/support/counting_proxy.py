"""A loopback HTTP proxy that records every call a worker makes (method, path, answer status).

A worker is pointed at ``proxy.url`` instead of the API server's, so a test can count what the
worker sent (how often it polled after a 429, whether it reported anything about a lease it was
told is cancelled) without reading the worker's logs or changing its code:

    with CountingProxy(api_server.port) as proxy:
        worker = Worker(Client(proxy.url, key), ...)
        ...
        assert len(proxy.calls("/acquire")) <= 5

``proxy.refuse("/acquire", 429, retry_after=1)`` answers matching calls itself (as a gateway's
rate limit would) until ``proxy.refuse(None)``; they are recorded like the rest.
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

# Headers that describe the hop, not the message: never passed through.
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Call:
    method: str
    path: str
    status: int | None = None  # None while the upstream has not answered (a long-poll still open)
    body: bytes = b""


class CountingProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._refusal: tuple[str, int, dict[str, str], bytes] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the SDK and Node's fetch use it

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                call = Call(self.command, self.path, body=body)
                with proxy._lock:
                    proxy._calls.append(call)
                    refusal = proxy._refusal
                if refusal is not None and refusal[0] in self.path:
                    status, answer_headers, data = refusal[1], list(refusal[2].items()), refusal[3]
                else:
                    status, answer_headers, data = proxy._upstream(self.command, self.path, self.headers.items(), body)
                with proxy._lock:
                    call.status = status
                self.send_response(status)
                for key, value in answer_headers:
                    self.send_header(key, value)
                if status not in (204, 304):
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if status not in (204, 304):
                    self.wfile.write(data)

            do_GET = do_POST = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-proxy", daemon=True)

    def _upstream(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        sent = {k: v for k, v in headers if k.lower() not in HOP_HEADERS}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            upstream.request(method, path, body=body or None, headers=sent)
            answer = upstream.getresponse()
            data = answer.read()
            return answer.status, [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_HEADERS], data
        except (OSError, http.client.HTTPException):
            return 502, [], b""  # the server is gone: what a dead server looks like through a proxy
        finally:
            upstream.close()

    def refuse(self, path_part: str | None, status: int = 429, *, retry_after: float | None = None) -> None:
        """Answer calls whose path contains ``path_part`` with ``status`` (None: forward everything again)."""
        if path_part is None:
            with self._lock:
                self._refusal = None
            return
        headers = {"Content-Type": "application/json"}
        if retry_after is not None:
            headers["Retry-After"] = f"{retry_after:g}"
        body = json.dumps({"error": f"http_{status}", "message": "refused by the test's proxy"}).encode()
        with self._lock:
            self._refusal = (path_part, status, headers, body)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def calls(self, path_part: str = "", *, status: int | None = None) -> list[Call]:
        """The calls whose path contains ``path_part`` (and answered ``status``, when given), in order."""
        with self._lock:
            return [c for c in self._calls if path_part in c.path and (status is None or c.status == status)]

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
