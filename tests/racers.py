"""Real processes racing past a barrier, each with its own PostgreSQL connection.

Threads share one interpreter (and the GIL decides who runs when); a deadlock or a lost
update between *sessions* shows most reliably with separate processes released together.
Children are spawned (not forked: a forked child would share the parent's database socket),
set up Django against the test database, and run ``target`` once per round after a barrier.

``target`` is "module:function"; it is imported in the child after ``django.setup()``, takes
the round's payload and returns something picklable (or raises: the child reports the error
by class and message, so the test can show it).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import queue as queue_module
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Nothing here may import Django models at module level: a spawned child unpickles ``_child``
# (importing this module) before it has set Django up.


@dataclass(frozen=True)
class Outcome:
    racer: int
    round: int
    value: Any = None
    error: str = ""  # "ClassName: message" when the call raised


def _child(env: dict[str, str], target: str, racer: int, payloads: Sequence[Any], barrier: Any, out: Any) -> None:
    os.environ.update(env)
    import django

    django.setup()
    import tests.kinds  # noqa: F401  (the test-only kinds)

    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    for number, payload in enumerate(payloads):
        barrier.wait(timeout=120)
        try:
            out.put(Outcome(racer=racer, round=number, value=function(payload)))
        except Exception as exc:
            out.put(Outcome(racer=racer, round=number, error=f"{type(exc).__name__}: {exc}"))
        finally:
            from django.db import connection

            connection.close()  # the next round opens a fresh session, like a new request


def race(target: str, payloads: Sequence[Sequence[Any]], *, timeout: float = 240.0) -> list[Outcome]:
    """Run ``target`` in ``len(payloads)`` processes; racer i runs payloads[i][r] in round r.

    Every round starts when all racers reach the barrier. Returns every outcome, in no order.
    """
    rounds = {len(p) for p in payloads}
    assert len(rounds) == 1, "every racer runs the same number of rounds"
    from tests.conftest import worker_env

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(payloads))
    out = context.Queue()
    env = {key: value for key, value in worker_env().items() if key != "KOALA_JOB_KIND_MODULES"}
    procs = [
        context.Process(target=_child, args=(env, target, racer, list(p), barrier, out), daemon=True)
        for racer, p in enumerate(payloads)
    ]
    for proc in procs:
        proc.start()
    expected = len(payloads) * rounds.pop()
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < expected:
            try:
                outcomes.append(out.get(timeout=1.0))
                continue
            except queue_module.Empty:
                pass
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise AssertionError(f"racers stalled after {len(outcomes)}/{expected} outcomes (exit codes {dead})")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return outcomes
