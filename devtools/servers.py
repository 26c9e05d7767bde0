"""How Koala's web server is started: the one uvicorn command line ``koala_run``, the tests'
live API server (tests/support/api_server.py) and the worker API benchmark all use."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def uvicorn_command(
    *, host: str, port: int, access_log: bool = True, graceful_seconds: float = 5, extra: tuple[str, ...] = ()
) -> list[str]:
    """``python -m uvicorn koala.asgi:application`` bound to ``host``:``port``.

    ``--lifespan off``: Django's ASGI handler does not speak the lifespan protocol (uvicorn would
    only log that it is unsupported). ``--app-dir``: the checkout, wherever the caller stands.
    """
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "koala.asgi:application",
        "--app-dir",
        str(REPO),
        "--host",
        host,
        "--port",
        str(port),
        "--lifespan",
        "off",
        "--timeout-graceful-shutdown",
        f"{graceful_seconds:g}",
    ]
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
