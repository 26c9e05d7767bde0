"""Job kinds used only by the tests. Loaded through KOALA_JOB_KIND_MODULES.

``probe`` writes one line per body start and one per body end to a log file
named in its input. The file is outside Koala (the "outside world"), so counting
its lines counts real executions of the body, whatever Koala's own records say.
"""

from __future__ import annotations

import os
import time
from typing import Any

from workers.errors import Retryable, TerminalFailure
from workers.kinds import job_kind
from workers.models import Delivery
from workers.runtime import JobContext


def effect(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def effect_lines(path: str) -> list[list[str]]:
    try:
        with open(path) as handle:
            return [line.split() for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def _probe(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    log = data["log"]
    effect(log, f"start {ctx.job_id} {ctx.attempt} {os.getpid()}")
    deadline = time.monotonic() + float(data.get("seconds", 0))
    while time.monotonic() < deadline:
        if data.get("cooperative", True) and ctx.cancelled.is_set():
            ctx.checkpoint()
        time.sleep(0.02)
    effect(log, f"end {ctx.job_id} {ctx.attempt} {os.getpid()}")
    return {"pid": os.getpid()}


job_kind("probe", version=1, queue="default", max_attempts=3, timeout_seconds=120, backoff_base=0.05, backoff_cap=0.2)(_probe)
job_kind("probe_once", version=1, queue="default", delivery=Delivery.AT_MOST_ONCE, max_attempts=1, timeout_seconds=120)(_probe)


@job_kind("transient", version=1, queue="default", max_attempts=4, backoff_base=0.2, backoff_cap=0.5)
def transient(ctx: JobContext, data: dict[str, Any]) -> None:
    raise Retryable(f"provider returned 503 (attempt {ctx.attempt})")


@job_kind("terminal", version=1, queue="default", max_attempts=4)
def terminal(ctx: JobContext, data: dict[str, Any]) -> None:
    raise TerminalFailure("account is not authorized", code="unauthorized")


@job_kind("boom", version=1, queue="default", max_attempts=4, sensitive_fields={"card"})
def boom(ctx: JobContext, data: dict[str, Any]) -> None:
    # The message carries secrets on purpose: they must not reach the database.
    raise ValueError(f"charge failed for card {data.get('card')} with Authorization: Bearer {data.get('bearer', '')}")


@job_kind(
    "slow_uncooperative", version=1, queue="default", max_attempts=2, timeout_seconds=0.5, backoff_base=0.01, backoff_cap=0.01
)
def slow_uncooperative(ctx: JobContext, data: dict[str, Any]) -> None:
    time.sleep(float(data.get("seconds", 5)))


@job_kind("versioned", version=1, queue="default", max_attempts=3)
def versioned_v1(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    if "log" in data:
        effect(data["log"], f"v1 {ctx.job_id} {os.getpid()}")
    return {"served_by": "v1", "pid": os.getpid()}


# Workers started with KOALA_TEST_NO_V2=1 lack version 2: the rolling-deploy case (R17).
if os.environ.get("KOALA_TEST_NO_V2") != "1":

    @job_kind("versioned", version=2, queue="default", max_attempts=3)
    def versioned_v2(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
        if "log" in data:
            effect(data["log"], f"v2 {ctx.job_id} {os.getpid()}")
        return {"served_by": "v2", "pid": os.getpid()}


# --- Added for the acceptance fault tests (tests/acceptance/test_faults.py) ---------------------


def _probe_long_first(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Like ``probe``, but the job's first execution (no earlier 'start' line for this job in
    the log) runs ``first_seconds`` and ignores cancellation unless ``first_cooperative``; later
    executions run ``seconds``. Lets a test interrupt a long first run without waiting as long
    for the replacement run."""
    log = data["log"]
    earlier = [line for line in effect_lines(log) if line[:2] == ["start", str(ctx.job_id)]]
    effect(log, f"start {ctx.job_id} {ctx.attempt} {os.getpid()}")
    seconds = float(data.get("first_seconds", 20)) if not earlier else float(data.get("seconds", 0))
    cooperative = data.get("cooperative", True) if earlier else data.get("first_cooperative", False)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cooperative and ctx.cancelled.is_set():
            ctx.checkpoint()
        time.sleep(0.02)
    effect(log, f"end {ctx.job_id} {ctx.attempt} {os.getpid()}")
    return {"pid": os.getpid()}


job_kind("probe_long_first", version=1, queue="default", max_attempts=3, timeout_seconds=120)(_probe_long_first)


@job_kind("backoff_probe", version=1, queue="default", max_attempts=4, backoff_base=0.2, backoff_cap=0.5)
def backoff_probe(ctx: JobContext, data: dict[str, Any]) -> None:
    """Always transient. Records, at the start of each attempt, the job's scheduled_at as the
    engine stored it: for attempt n > 1 that is the time the previous retry scheduled."""
    from workers.models import Job

    scheduled_at = Job.objects.values_list("scheduled_at", flat=True).get(pk=ctx.job_id)
    effect(data["log"], f"try {ctx.job_id} {ctx.attempt} {os.getpid()} {scheduled_at.isoformat()}")
    raise Retryable(f"storage blip (attempt {ctx.attempt})")
