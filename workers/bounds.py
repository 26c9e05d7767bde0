"""Per-attempt resource ceilings: memory and CPU time, enforced with setrlimit in the fork worker's work horse.

A kind's ``memory_limit_mb`` and ``cpu_limit_seconds`` (or the settings
``KOALA_ATTEMPT_MEMORY_LIMIT_MB`` / ``KOALA_ATTEMPT_CPU_LIMIT_SECONDS`` when it declares none;
0 turns a ceiling off) bound each attempt of the kind (docs/operations.md, "Resource bounds"):

- **Memory**: while the body runs, ``RLIMIT_DATA`` (the process's private writable memory:
  heap, anonymous mappings, thread stacks) is set to what the horse holds when the attempt
  starts plus the kind's allowance. An allocation past it fails (``MemoryError``); the body is
  unwound, the limit is lifted again (the soft limit only: it can be raised back), and the
  attempt ends ``MemoryLimitExceeded``. Relative, not absolute, because what an idle horse holds
  depends on the kinds loaded; the sizing rule adds the idle size (docs/operations.md).
- **CPU time**: ``RLIMIT_CPU``'s soft limit is the CPU time used so far plus the allowance: the
  kernel sends ``SIGXCPU`` there, and the handler raises ``CpuLimitExceeded`` into the body
  (a BaseException: a body's ``except Exception`` cannot swallow it). A body stuck in native
  code never sees the handler run; the hard limit, CPU_GRACE_SECONDS later, is the kernel's
  SIGKILL. A hard limit can only be lowered, so a CPU-limited attempt is the last one its horse
  runs (``spent``): the batch's waiting jobs are given back and the doorbell rings for them.
- **A horse that dies without reporting** (the SIGKILL at the hard limit, a native allocation
  that aborts): before each limited body the horse writes the attempt and its ceilings to a
  page shared with its parent (``Slate``); the parent, seeing its horse die, reads it and
  records the ending under the same name (``rq_workers.KoalaWorker.handle_work_horse_killed``).

The simple worker has no horse: a ceiling set there would bound the worker process itself, so it
enforces none and says so at start (``warn_unenforced``). Endings are decided in
``workers.outcomes`` (``OverLimit``) and written by the one transition writer.
"""

from __future__ import annotations

import enum
import logging
import math
import mmap
import os
import resource
import signal
import struct
from dataclasses import dataclass
from typing import Any

from django.conf import settings

log = logging.getLogger("koala.worker")

MIB = 1024 * 1024
# CPU seconds between SIGXCPU (the soft limit: the body is told) and SIGKILL (the hard limit: the
# kernel ends a body that could not be told, e.g. one spinning in native code). Long enough for a
# Python body to unwind and the horse to report; short enough to bound a runaway.
CPU_GRACE_SECONDS = 2


class Limit(enum.StrEnum):
    """Which ceiling an attempt went past."""

    MEMORY = "memory"
    CPU = "cpu"


class CpuLimitExceeded(BaseException):
    """Raised into a body by SIGXCPU: its attempt used up its CPU-time allowance."""


@dataclass(frozen=True)
class Limits:
    """One attempt's ceilings: MiB of memory above what the horse held at its start, CPU seconds
    (0: none)."""

    memory_mb: int = 0
    cpu_seconds: int = 0

    def __bool__(self) -> bool:
        return bool(self.memory_mb or self.cpu_seconds)


def limits_for(kind: Any) -> Limits:
    """The ceilings of an attempt of ``kind``: its own declaration, else the settings' defaults."""
    memory = kind.memory_limit_mb if kind.memory_limit_mb is not None else settings.KOALA_ATTEMPT_MEMORY_LIMIT_MB
    cpu = kind.cpu_limit_seconds if kind.cpu_limit_seconds is not None else settings.KOALA_ATTEMPT_CPU_LIMIT_SECONDS
    return Limits(memory_mb=int(memory), cpu_seconds=int(cpu))


def check_limit(owner: str, name: str, value: Any) -> None:
    """A ceiling must be None (the setting's default) or a whole number ≥ 0 (0: none)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"{owner}: {name} must be a whole number ≥ 0 (0: no ceiling) or None (the setting's default), not {value!r}"
        )


def describe(limit: Limit, limits: Limits) -> str:
    """The attempt row's message for a ceiling breach."""
    if limit is Limit.MEMORY:
        return f"the attempt went past its memory ceiling of {limits.memory_mb} MiB (RLIMIT_DATA above the work horse's start)"
    return f"the attempt went past its CPU-time ceiling of {limits.cpu_seconds} s"


# -- the page shared with the parent ----------------------------------------------------------------

# attempt_id, lease_token, memory_mb, cpu_seconds, cpu hard limit (seconds), armed (0/1)
_SLATE = struct.Struct("<qqqqqq")


@dataclass(frozen=True)
class Written:
    """What a horse wrote before its limited body began (read by the parent after the horse died)."""

    attempt_id: int
    lease_token: int
    limits: Limits
    cpu_hard: int


class Slate:
    """An anonymous shared page, mapped by the parent before it forks, written by the horse."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED | MAP_ANONYMOUS: the child writes, the parent reads

    def write(self, *, attempt_id: int, lease_token: int, limits: Limits, cpu_hard: int) -> None:
        self.page[: _SLATE.size] = _SLATE.pack(attempt_id, lease_token, limits.memory_mb, limits.cpu_seconds, cpu_hard, 1)

    def clear(self) -> None:
        self.page[: _SLATE.size] = bytes(_SLATE.size)

    def read(self) -> Written | None:
        attempt_id, token, memory, cpu, hard, armed = _SLATE.unpack(self.page[: _SLATE.size])
        if not armed:
            return None
        return Written(attempt_id=attempt_id, lease_token=token, limits=Limits(memory_mb=memory, cpu_seconds=cpu), cpu_hard=hard)


def cause_of_death(written: Written, status: int | None, cpu_used: float | None) -> Limit | None:
    """Which ceiling a horse that died without reporting went past, from its wait status and the
    CPU time it used (``os.wait4``'s rusage); None when neither explains it (the reaper decides)."""
    if status is None:
        return None
    signaled = os.WIFSIGNALED(status)
    sig = os.WTERMSIG(status) if signaled else 0
    if written.limits.cpu_seconds and signaled and sig in (signal.SIGKILL, signal.SIGXCPU):
        # The rusage figure runs a little behind the kernel's own count (sampled ticks), so the
        # test is "past the soft limit": a SIGKILL from elsewhere (an operator, the OOM killer)
        # before the allowance was used up is not the ceiling's.
        if sig == signal.SIGXCPU or (cpu_used is not None and cpu_used >= written.cpu_hard - CPU_GRACE_SECONDS):
            return Limit.CPU
    if written.limits.memory_mb and (signaled or os.WEXITSTATUS(status) != 0):
        return Limit.MEMORY  # a native allocation past RLIMIT_DATA that the code could not survive
    return None


# -- the horse's side --------------------------------------------------------------------------------


class Bounds:
    """This process's enforcement: off (the simple worker, the parent), or on in a work horse."""

    def __init__(self) -> None:
        self.enforcing = False
        self.slate: Slate | None = None
        self.spent = False  # the CPU hard limit was lowered: this horse runs no more CPU-limited attempts
        self._armed: Limits | None = None
        self._in_body = False
        self._data_before: tuple[int, int] | None = None
        self._cpu_before: tuple[int, int] | None = None

    def prepare_parent(self) -> Slate:
        """In the forking worker, before any fork: the page its horses write to."""
        if self.slate is None:
            self.slate = Slate()
        return self.slate

    def enable_in_horse(self) -> None:
        """In a freshly forked work horse: enforce ceilings from now on."""
        self.enforcing = True
        self.spent = False
        if self.slate is not None:
            self.slate.clear()
        signal.signal(signal.SIGXCPU, self._on_xcpu)

    def _on_xcpu(self, signum: int, frame: Any) -> None:
        if self._in_body:
            self._in_body = False  # once: the next SIGXCPU (a second later) finds the body unwinding
            raise CpuLimitExceeded()

    def arm(self, limits: Limits, *, attempt_id: int, lease_token: int) -> None:
        """Set the attempt's ceilings just before its body (no-op unless enforcing)."""
        if not (self.enforcing and limits):
            return
        cpu_hard = 0
        if limits.memory_mb:
            self._data_before = resource.getrlimit(resource.RLIMIT_DATA)
            ceiling = _data_bytes() + limits.memory_mb * MIB
            hard = self._data_before[1]
            if hard != resource.RLIM_INFINITY:
                ceiling = min(ceiling, hard)
            resource.setrlimit(resource.RLIMIT_DATA, (ceiling, hard))
        if limits.cpu_seconds:
            self._cpu_before = resource.getrlimit(resource.RLIMIT_CPU)
            soft = math.ceil(_cpu_used()) + limits.cpu_seconds
            cpu_hard = soft + CPU_GRACE_SECONDS
            hard = self._cpu_before[1]
            if hard != resource.RLIM_INFINITY:
                cpu_hard = min(cpu_hard, hard)
                soft = min(soft, cpu_hard)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
            self.spent = True
        if self.slate is not None:
            self.slate.write(attempt_id=attempt_id, lease_token=lease_token, limits=limits, cpu_hard=cpu_hard)
        self._armed = limits
        self._in_body = True

    def disarm(self) -> Limits | None:
        """Right after the body: lift the soft ceilings (the hard CPU limit stays). Returns the
        limits that were armed, if any."""
        self._in_body = False
        armed, self._armed = self._armed, None
        if armed is None:
            return None
        if self._data_before is not None:
            resource.setrlimit(resource.RLIMIT_DATA, self._data_before)
            self._data_before = None
        if self._cpu_before is not None:
            _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))  # the report must not be told off
            self._cpu_before = None
        if self.slate is not None:
            self.slate.clear()
        return armed


def _data_bytes() -> int:
    """The process's VmData now (what RLIMIT_DATA counts), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmData line")


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def warn_unenforced(worker_class: str) -> None:
    """The simple worker runs bodies in its own process: it cannot bound one attempt without
    bounding itself, so configured ceilings are not enforced there; say so once, at start."""
    configured = settings.KOALA_ATTEMPT_MEMORY_LIMIT_MB or settings.KOALA_ATTEMPT_CPU_LIMIT_SECONDS
    from workers import kinds

    declared = [k.key for k in kinds.runnable() if k.memory_limit_mb or k.cpu_limit_seconds]
    if configured or declared:
        log.warning(
            "worker class %r enforces no per-attempt memory or CPU ceiling (KOALA_ATTEMPT_MEMORY_LIMIT_MB=%s, "
            "KOALA_ATTEMPT_CPU_LIMIT_SECONDS=%s%s): bodies run in the worker process itself; "
            "use --worker-class fork to enforce them (docs/operations.md, Resource bounds)",
            worker_class,
            settings.KOALA_ATTEMPT_MEMORY_LIMIT_MB,
            settings.KOALA_ATTEMPT_CPU_LIMIT_SECONDS,
            f"; kinds declaring their own: {', '.join(declared)}" if declared else "",
        )


_bounds: Bounds | None = None


def get_bounds() -> Bounds:
    global _bounds
    if _bounds is None:
        _bounds = Bounds()
    return _bounds
