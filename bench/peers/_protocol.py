"""What every peer driver shares with bench/compare.py: the roles, their arguments, and the
line protocol on the driver's own copy of stdout. Standard library only.

Roles (``python -m bench.peers.NAME ROLE [options]``):

- ``reset``: make the system's storage empty (its schema created if missing); prints ``{"ok": true}``.
- ``worker``: does its imports and set-up, prints ``ready``, waits for ``go`` on stdin, prints
  ``waiting`` when it is about to take jobs, then works until SIGTERM.
- ``enqueue``: does its set-up, prints ``ready``, waits for ``go``, enqueues ``--jobs`` jobs one by
  one and prints ``{"start": t, "end": t}`` (wall clock).
- ``verify``: prints ``{"problems": [...]}``: empty when the counter equals ``--jobs`` and the
  system's own records say every job finished once.
- ``drop``: removes what ``reset`` created (the driver's PostgreSQL schema); prints ``{"ok": true}``.

Everything else the libraries print (Celery's banner, logs) goes to stderr: the driver moves its
stdout to stderr at start and keeps a private copy for these lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import IO, Any

ROLES = ("reset", "worker", "enqueue", "verify", "drop")


class DriverArgumentError(ValueError):
    """The driver's arguments or environment are not usable (named, before anything is touched)."""


def parse(argv: Sequence[str], *, description: str, needs: Sequence[str]) -> argparse.Namespace:
    """The driver's arguments; ``needs`` are the environment variables it requires
    (``REDIS_URL``, ``DATABASE_URL``). Raises DriverArgumentError on bad input."""
    parser = argparse.ArgumentParser(description=description, exit_on_error=False)
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--jobs", type=int, default=0, help="jobs to enqueue or expect (enqueue, verify)")
    parser.add_argument("--key", default="koala:bench:peer", help="the Redis counter the body INCRs")
    parser.add_argument("--queue", default="bench", help="the queue name")
    parser.add_argument("--index", type=int, default=0, help="this worker's number (its name)")
    try:
        args, unknown = parser.parse_known_args(list(argv))
    except (argparse.ArgumentError, SystemExit) as error:
        raise DriverArgumentError(str(error)) from None
    if unknown:
        raise DriverArgumentError(f"unknown arguments {unknown}")
    if args.role in ("enqueue", "verify") and args.jobs < 1:
        raise DriverArgumentError(f"{args.role} needs --jobs >= 1, got {args.jobs}")
    if args.index < 0:
        raise DriverArgumentError(f"--index must be >= 0, got {args.index}")
    if not args.key:
        raise DriverArgumentError("--key must not be empty")
    missing = [name for name in needs if not os.environ.get(name)]
    if missing:
        raise DriverArgumentError(f"{', '.join(missing)} not set")
    return args


def counter_problems(counter: int, jobs: int) -> list[str]:
    """The same body ran exactly once per job: the Redis counter equals the job count."""
    return [] if counter == jobs else [f"redis counter {counter} != {jobs}"]


def status_problems(statuses: dict[str, int], jobs: int, *, done: str, what: str) -> list[str]:
    """Every one of ``jobs`` durable rows ended in ``done`` (``statuses``: status -> row count)."""
    if statuses != {done: jobs}:
        return [f"{what} {dict(sorted(statuses.items()))}, expected {{{done!r}: {jobs}}}"]
    return []


class Channel:
    """The driver's line protocol: a private copy of stdout; fd 1 itself now points at stderr."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def send(self, line: str | dict[str, Any]) -> None:
        self._out.write((json.dumps(line) if isinstance(line, dict) else line) + "\n")
        self._out.flush()

    def hold(self) -> bool:
        """``ready``, then wait for the orchestrator's ``go``; False if it went away first."""
        self.send("ready")
        return bool(sys.stdin.readline())


def main(argv: Sequence[str], *, name: str, description: str, needs: Sequence[str], roles: dict[str, Any]) -> int:
    """Parse, then run ``roles[role](args, channel)``; a bad argument is exit status 2 with its reason."""
    try:
        args = parse(argv, description=description, needs=needs)
    except DriverArgumentError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 2
    channel = Channel()
    return int(roles[args.role](args, channel) or 0)
