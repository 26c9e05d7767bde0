"""The safety layer with real worker subprocesses: budgets under concurrency, pauses while
work runs, and the circuit breaker after real crashes (kill -9 of the work horse).

Assertions read the database and the outside world's effect files, not log lines.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.inprocess import beat_tick
from tests.kinds import world_effects
from tests.support.fleet import assert_engine_invariants, ends, ring_for, starts, wait_quiet, wait_workers_ready
from workers.models import Attempt, BudgetUsage, Job, Operation, Pause
from workers.services import budgets, pauses
from workers.services.jobs import JobSpec, enqueue, enqueue_many

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def states(ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in Job.objects.filter(pk__in=ids).values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


# Issue 3, test 4 ----------------------------------------------------------------------------------
def test_twenty_concurrent_jobs_against_a_budget_for_seven(processes, tmp_path: Path) -> None:
    budget = budgets.create_budget(name="seven", scope="kind", target="tests.spend", spend_limit_minor=700, actor="ops")
    world = str(tmp_path / "world.log")
    workers = [processes.worker("--name", f"spend-{n}") for n in range(4)]
    wait_workers_ready(workers)
    specs = [JobSpec(kind="tests.spend", input={"world": world, "cost": 100, "n": n, "seconds": 0.2}) for n in range(20)]
    ids = [r.job_id for r in enqueue_many(specs=specs)]

    def settled() -> bool:
        return states(ids).get("queued", 0) + states(ids).get("running", 0) == 0

    wait_for(settled, timeout=60, what="all 20 jobs to succeed or park")
    assert states(ids) == {"succeeded": 7, "parked": 13}
    assert len(world_effects(world)) == 7  # the provider saw exactly seven spends
    usage = BudgetUsage.objects.get(budget=budget)
    assert (usage.spent_minor, usage.reserved_minor, usage.requests) == (700, 0, 7)
    parked = Job.objects.filter(pk__in=ids, state="parked")
    assert {j.park_reason for j in parked} == {"budget"}
    assert all("spend limit 700" in j.park_detail for j in parked)
    assert not Operation.objects.filter(job__in=parked).exists()  # nothing was even recorded for them
    # Overlap was real: several workers ran spends at the same time.
    assert len({line[3] for line in world_effects(world)}) >= 2
    assert_engine_invariants()


# Issue 3, test 6 ----------------------------------------------------------------------------------
def test_drain_pause_lets_in_flight_finish_and_claims_nothing_until_resumed(processes, tmp_path: Path) -> None:
    log = str(tmp_path / "steady.log")
    beat = processes.beat()
    worker = processes.worker("--name", "drain-w")
    wait_workers_ready([worker])
    running = enqueue(kind="tests.steady", input={"log": log, "seconds": 2}).job_id
    wait_for(lambda: starts(log, running), what="the long job to start")

    row = pauses.pause(scope="queue", target="default", mode="drain", reason="deploy", actor="ops")
    waiting = [enqueue(kind="tests.steady", input={"log": log, "seconds": 0}).job_id for _ in range(3)]
    wait_for(lambda: Job.objects.get(pk=running).state == "succeeded", timeout=20, what="in-flight job to finish")
    assert len(ends(log, running)) == 1 and Attempt.objects.filter(job_id=running).count() == 1
    # Doorbells naming the paused jobs, a beat tick, and every message handled: still nothing claimed.
    ring_for("default", waiting)
    beat_tick()
    wait_quiet("default")
    assert states(waiting) == {"queued": 3}
    assert not Attempt.objects.filter(job_id__in=waiting).exists()

    pauses.resume(pause_id=row.pk, actor="ops")
    wait_for(lambda: states(waiting) == {"succeeded": 3}, timeout=20, what="paused jobs to run after resume")
    assert beat.poll() is None
    assert_engine_invariants()


def test_stop_pause_cancels_running_work_at_the_next_heartbeat_without_using_an_attempt(processes, tmp_path: Path) -> None:
    log = str(tmp_path / "steady.log")
    processes.beat()
    worker = processes.worker("--name", "stop-w")
    wait_workers_ready([worker])
    job_id = enqueue(kind="tests.steady", input={"log": log, "seconds": 30}).job_id
    wait_for(lambda: starts(log, job_id), what="the long job to start")

    paused_at = time.monotonic()
    row = pauses.pause(scope="kind", target="tests.steady", mode="stop", reason="bad deploy", actor="ops")
    wait_for(lambda: Job.objects.get(pk=job_id).state == "queued", timeout=10, what="the job to be released")
    job = Job.objects.get(pk=job_id)
    released_after = time.monotonic() - paused_at
    print(f"stop pause: running job released {released_after:.2f}s after the pause")
    assert released_after < 3.0, f"released {released_after:.1f}s after the stop pause (heartbeat 0.5 s)"
    assert job.attempts == 0  # released: no attempt used
    first = Attempt.objects.get(job_id=job_id)
    assert first.outcome == "interrupted" and "stop pause" in first.error_message
    ring_for("default", [job_id])  # a doorbell for it, and a beat tick: not reclaimed while paused
    beat_tick()
    wait_quiet("default")
    assert Job.objects.get(pk=job_id).state == "queued" and len(starts(log, job_id)) == 1

    Job.objects.filter(pk=job_id).update(input={"log": log, "seconds": 0})  # (test shortcut: finish fast after resume)
    pauses.resume(pause_id=row.pk, actor="ops")
    wait_for(lambda: Job.objects.get(pk=job_id).state == "succeeded", timeout=20, what="the job to finish after resume")
    assert [a.outcome for a in Attempt.objects.filter(job_id=job_id).order_by("number")] == ["interrupted", "succeeded"]
    assert_engine_invariants()


# Issue 3, test 7 ----------------------------------------------------------------------------------
def test_five_crashes_in_a_row_trip_the_circuit_breaker(processes, tmp_path: Path) -> None:
    processes.beat()
    # The fork worker survives its work horse's kill -9, so five crashes need no restarts.
    worker = processes.worker("--name", "crashy", "--worker-class", "fork")
    wait_workers_ready([worker])
    crashes = [enqueue(kind="tests.crash", input={"n": n}).job_id for n in range(5)]
    wait_for(
        lambda: Pause.objects.filter(scope="kind", target="tests.crash", source="circuit_breaker").exists(),
        timeout=60,
        what="the breaker to pause tests.crash",
    )
    breaker = Pause.objects.get(scope="kind", target="tests.crash")
    assert breaker.mode == "drain" and "last 5 attempts" in breaker.reason and breaker.lifted_at is None
    assert Attempt.objects.filter(job_id__in=crashes, outcome="orphaned").count() == 5

    # The paused kind stays queued; other kinds keep running.
    held = enqueue(kind="tests.crash", input={"n": 99}).job_id
    log = str(tmp_path / "steady.log")
    other = enqueue(kind="tests.steady", input={"log": log, "seconds": 0}).job_id
    wait_for(lambda: Job.objects.get(pk=other).state == "succeeded", timeout=20, what="another kind to keep running")
    ring_for("default", [held])  # a doorbell naming it reaches the worker: the breaker holds it
    beat_tick()
    wait_quiet("default")
    assert Job.objects.get(pk=held).state == "queued" and not Attempt.objects.filter(job_id=held).exists()
    assert worker.poll() is None
