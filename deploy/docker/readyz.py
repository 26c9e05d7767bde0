"""The image's HEALTHCHECK: ``GET /readyz`` on this container's web (docs/operations.md, "Health
checks"); exit 0 when it answers 200 (PostgreSQL and Redis reachable, migrations applied), 1
otherwise. Python, because the slim image has no curl.

The request is the one a proxy would forward: ``Host`` is the first of ``ALLOWED_HOSTS`` (any other
would be refused with a 400), ``X-Forwarded-Proto: https`` so a deployment with
``KOALA_SECURE_SSL_REDIRECT`` answers instead of redirecting (uvicorn applies it from 127.0.0.1,
where this runs). It prints /readyz's one word per check and nothing else.
"""

from __future__ import annotations

import http.client
import os
import sys


def probe_host(allowed_hosts: str) -> str:
    """The Host to send: the first allowed host that is a name (``.example.com`` → ``example.com``)."""
    for entry in (h.strip() for h in allowed_hosts.split(",")):
        if entry and entry != "*":
            return entry.lstrip(".")
    return "localhost"


def main() -> int:
    port = int(os.environ.get("KOALA_PORT", "8000"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=4)
    try:
        conn.request(
            "GET",
            "/readyz",
            headers={"Host": probe_host(os.environ.get("ALLOWED_HOSTS", "localhost")), "X-Forwarded-Proto": "https"},
        )
        response = conn.getresponse()
        body = response.read(200).decode("utf-8", errors="replace")
    except OSError as exc:
        print(f"readyz: no answer on port {port} ({type(exc).__name__})", file=sys.stderr)
        return 1
    finally:
        conn.close()
    print(f"readyz: {response.status}; " + "; ".join(body.split("\n")).strip("; "))
    return 0 if response.status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
