"""Kinds that ship with the engine: a no-op, a Redis INCR (the benchmark body), a
cooperative sleep, a flaky demo, and the two remote kinds the example HTTP workers serve.
The side-effect kinds (email, orders, charges, model calls) are in effects/kinds.py, the CSV
export in exports/jobs.py."""

from __future__ import annotations

import time
from typing import Any

from workers import JobContext, Retryable, TerminalFailure, doorbell, job_kind, remote_kind, workflow


@job_kind("noop", version=1, queue="default", max_attempts=3, timeout_seconds=30)
def noop(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}


def _validate_incr(data: dict[str, Any]) -> None:
    if not isinstance(data.get("key"), str) or not data["key"].startswith("koala:"):
        raise ValueError("'key' must be a string starting with 'koala:'")


@job_kind(
    "incr", version=1, queue="default", max_attempts=3, timeout_seconds=30, required_fields={"key"}, validate=_validate_incr
)
def incr(ctx: JobContext, data: dict[str, Any]) -> int:
    """INCR a Redis counter: the smallest real side effect, used by the benchmark."""
    return int(doorbell.redis_connection().incr(data["key"]))


def _validate_sleep(data: dict[str, Any]) -> None:
    seconds = data.get("seconds")
    if not isinstance(seconds, int | float) or not 0 <= seconds <= 3600:
        raise ValueError("'seconds' must be a number between 0 and 3600")


@job_kind(
    "sleep",
    version=1,
    queue="default",
    max_attempts=3,
    timeout_seconds=3700,
    required_fields={"seconds"},
    validate=_validate_sleep,
)
def sleep(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sleeps in small steps, checkpointing progress and honouring cancellation."""
    total = float(data["seconds"])
    done = float(ctx.previous_progress.get("slept", 0.0))
    while done < total:
        if ctx.cancelled.is_set():
            ctx.checkpoint()  # raises StaleAttempt with the named reason
        step = min(0.1, total - done)
        time.sleep(step)
        done += step
        ctx.progress(slept=round(done, 3))
    ctx.set_state(slept=total)
    return {"slept": total}


@job_kind("demo.flaky", version=1, queue="default", max_attempts=4, backoff_base=0.5, backoff_cap=5)
def flaky(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    """Fails transiently until attempt ``succeed_on`` (default 2); ``terminal`` fails for good."""
    if data.get("terminal"):
        raise TerminalFailure("demo terminal failure: unsupported format", code="unsupported_format")
    if ctx.attempt < int(data.get("succeed_on", 2)):
        raise Retryable(f"demo transient failure on attempt {ctx.attempt}")
    return {"succeeded_on_attempt": ctx.attempt}


# Kinds whose bodies run in workers over HTTP (docs/worker-api.md): Koala holds each one's contract
# (queue, retries, time limits, required input), the body lives in the worker; an RQ worker never
# claims them. Declared here, in a module every default KOALA_JOB_KIND_MODULES lists, so that the
# example workers run against `make run` as their READMEs say: http.echo is served by
# examples/node-worker, the Python SDK's example (examples/python-worker) and docs/worker-api.md's
# curl walk-through; http.invoice (write an invoice once, through the operations ledger) by the
# Python example.
remote_kind("http.echo", version=1, queue="default", max_attempts=3, timeout_seconds=60.0)
remote_kind(
    "http.invoice",
    version=1,
    queue="default",
    max_attempts=5,
    timeout_seconds=60.0,
    required_fields={"invoice", "amount_minor", "currency"},
)

# A workflow whose two steps run in HTTP workers: examples/node-worker and the Python SDK's
# example (examples/python-worker) serve both. ``greet``
# answers a greeting for the run's input ``name`` (and sets ``greeted`` in the run's state);
# ``shout`` follows it and sees its output in the lease's ``steps``. Start a run with
# ``POST /api/v1/runs {"definition": "http_hello", "input": {"name": "Ada"}}``.
hello = workflow("http_hello", version=1, required_fields={"name"})
hello.remote_step("greet", max_attempts=3, timeout_seconds=60.0)
hello.remote_step("shout", after=["greet"], max_attempts=3, timeout_seconds=60.0)
