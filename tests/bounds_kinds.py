"""Job kinds that go past their per-attempt ceilings (workers/bounds.py), for
tests/acceptance/test_resource_bounds.py. Loaded by the workers through KOALA_JOB_KIND_MODULES,
imported by the test for enqueueing.

Each body appends a line to the log file named in its input (the outside world: counting lines
counts real body runs and the work horse's pid).
"""

from __future__ import annotations

import os
from typing import Any

from tests.kinds import effect
from workers import JobContext, job_kind

MIB = 1024 * 1024
QUICK = {"queue": "default", "backoff_base": 0.05, "backoff_cap": 0.1}


def _started(ctx: JobContext, data: dict[str, Any]) -> None:
    effect(data["log"], f"start {ctx.job_id} {ctx.attempt} {os.getpid()}")


@job_kind("bounds.allocate", version=1, max_attempts=2, memory_limit_mb=64, **QUICK)  # type: ignore[arg-type]
def allocate(ctx: JobContext, data: dict[str, Any]) -> int:
    """Allocates ``mb`` MiB at once (past a 64 MiB ceiling: MemoryError in the horse)."""
    _started(ctx, data)
    block = bytearray(int(data["mb"]) * MIB)
    return len(block)


@job_kind("bounds.allocate_default", version=1, max_attempts=1, **QUICK)  # type: ignore[arg-type]
def allocate_default(ctx: JobContext, data: dict[str, Any]) -> int:
    """Declares no ceiling: KOALA_ATTEMPT_MEMORY_LIMIT_MB applies."""
    _started(ctx, data)
    return len(bytearray(int(data["mb"]) * MIB))


@job_kind("bounds.allocate_roomy", version=1, max_attempts=1, memory_limit_mb=512, **QUICK)  # type: ignore[arg-type]
def allocate_roomy(ctx: JobContext, data: dict[str, Any]) -> int:
    """Declares its own, larger ceiling: it wins over a smaller setting."""
    _started(ctx, data)
    return len(bytearray(int(data["mb"]) * MIB))


@job_kind("bounds.allocate_unbounded", version=1, max_attempts=1, memory_limit_mb=0, **QUICK)  # type: ignore[arg-type]
def allocate_unbounded(ctx: JobContext, data: dict[str, Any]) -> int:
    """Declares no ceiling at all (0) whatever the setting."""
    _started(ctx, data)
    return len(bytearray(int(data["mb"]) * MIB))


@job_kind("bounds.allocate_natively", version=1, max_attempts=2, memory_limit_mb=64, **QUICK)  # type: ignore[arg-type]
def allocate_natively(ctx: JobContext, data: dict[str, Any]) -> None:
    """A native library that cannot survive a failed allocation: it aborts the process (the
    horse dies without reporting; the parent names the ceiling)."""
    _started(ctx, data)
    try:
        bytearray(int(data["mb"]) * MIB)
    except MemoryError:
        os.abort()


@job_kind("bounds.spin", version=1, max_attempts=2, cpu_limit_seconds=1, timeout_seconds=120, **QUICK)  # type: ignore[arg-type]
def spin(ctx: JobContext, data: dict[str, Any]) -> None:
    """Spins in Python past a 1 s CPU ceiling: SIGXCPU tells it."""
    _started(ctx, data)
    while True:
        pass


@job_kind("bounds.spin_natively", version=1, max_attempts=2, cpu_limit_seconds=1, timeout_seconds=120, **QUICK)  # type: ignore[arg-type]
def spin_natively(ctx: JobContext, data: dict[str, Any]) -> int:
    """Spins inside one C call that never returns to the interpreter, so no Python signal handler
    runs: only the hard limit's SIGKILL ends it (the parent names the ceiling)."""
    _started(ctx, data)
    return sum(range(10**15))


@job_kind("bounds.ok", version=1, max_attempts=1, memory_limit_mb=64, cpu_limit_seconds=5, **QUICK)  # type: ignore[arg-type]
def ok(ctx: JobContext, data: dict[str, Any]) -> int:
    """Well within both ceilings."""
    _started(ctx, data)
    return os.getpid()
