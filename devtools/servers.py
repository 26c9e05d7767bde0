"""How Koala's web server is started: the one uvicorn command line ``koala_run``, the tests'
live API server (tests/support/api_server.py), the worker API benchmark and the systemd unit
(deploy/systemd/koala-web.service) all use."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# uvicorn's HTTP protocol with TCP_NODELAY on every connection (koala/http_protocol.py says why:
# without it, --workers costs every keep-alive call about 40 ms).
HTTP_PROTOCOL = "koala.http_protocol:HttpProtocol"


def uvicorn_command(
    *,
    host: str,
    port: int,
    access_log: bool = True,
    graceful_seconds: float = 5,
    workers: int | None = None,
    forwarded_allow_ips: str | None = None,
    python: str = sys.executable,
    app_dir: str = str(REPO),
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``python -m uvicorn koala.asgi:application`` bound to ``host``:``port``.

    ``--lifespan off``: Django's ASGI handler does not speak the lifespan protocol (uvicorn would
    only log that it is unsupported). ``--http``: uvicorn's own protocol with TCP_NODELAY set on
    every connection (koala/http_protocol.py). ``--app-dir``: the checkout, wherever the caller stands.
    ``workers``: that many server processes (each runs one long-poll hub). ``forwarded_allow_ips``:
    the TLS proxy's addresses, the only peers whose X-Forwarded-Proto/-For uvicorn applies.
    deploy/systemd/koala-web.service runs this command with ``python``/``app_dir`` under
    /opt/koala (tests/unit/test_deploy_units.py compares them).
    """
    command = [
        python,
        "-m",
        "uvicorn",
        "koala.asgi:application",
        "--app-dir",
        app_dir,
        "--host",
        host,
        "--port",
        str(port),
        "--lifespan",
        "off",
        "--timeout-graceful-shutdown",
        f"{graceful_seconds:g}",
        "--http",
        HTTP_PROTOCOL,
    ]
    if workers is not None:
        command += ["--workers", str(workers)]
    if forwarded_allow_ips is not None:
        command += ["--proxy-headers", "--forwarded-allow-ips", forwarded_allow_ips]
    if not access_log:
        command.append("--no-access-log")
    return [*command, *extra]


def wait_listening(proc: subprocess.Popen[bytes], port: int, *, timeout: float) -> bool:
    """Wait until ``proc`` accepts connections on 127.0.0.1:``port``; False if it exited or the
    time ran out first (the caller says what went wrong, with its log)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
