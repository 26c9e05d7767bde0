"""How Koala's web server is started: the one uvicorn command line ``koala_run``, the tests'
live API server (tests/support/api_server.py) and the worker API benchmark all use."""

from __future__ import annotations

import sys
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
