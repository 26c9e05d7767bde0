"""kill -9 of a worker in the middle of a batch claim (docs/engine.md, "Batch claims"): the jobs it
claimed but never started come back through the reaper per their delivery, and an at_most_once job
is never failed without its body having run (it is never claimed to wait in a batch)."""

from __future__ import annotations

import os
import signal
from typing import cast

import pytest

from tests.conftest import wait_for
from tests.support.fleet import assert_engine_invariants, attempts, starts, wait_all_terminal, wait_workers_ready
from workers.models import Job, Outcome
from workers.services.jobs import JobSpec, enqueue_many

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_kill_9_mid_batch_requeues_the_unstarted_jobs(processes, tmp_path, stray_pids) -> None:
    log = str(tmp_path / "effects.log")
    first = processes.worker("--name", "batcher")
    wait_workers_ready([first])
    specs = [JobSpec(kind="probe", input={"log": log, "seconds": 0.8, "n": n}) for n in range(14)]
    for n in (5, 9):
        specs[n] = JobSpec(kind="probe_once", input={"log": log, "seconds": 0.8, "n": n})
    ids = [h.job_id for h in enqueue_many(specs=specs)]

    def waiting() -> list[int]:
        # Held by the worker but its body never started: a batch's waiting leases.
        running = Job.objects.filter(pk__in=ids, state="running", lease_holder__isnull=False).values_list("pk", flat=True)
        started = {int(s[1]) for s in starts(log)}
        return [job_id for job_id in running if job_id not in started]

    held = cast(
        list[int], wait_for(lambda: waiting() if len(waiting()) >= 2 else None, timeout=30, what="a batch with waiting leases")
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    unstarted = [job_id for job_id in held if not starts(log, job_id)]
    assert unstarted  # at least one lease of the batch was still waiting its turn

    processes.beat()
    second = processes.worker("--name", "after")
    wait_workers_ready([second])
    wait_all_terminal(ids, timeout=90)

    for job_id in unstarted:  # requeued by the reaper (at_least_once, attempts left), then run once
        job = Job.objects.get(pk=job_id)
        assert job.state == "succeeded", (job_id, job.state, job.failure_reason)
        assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]
        assert len(starts(log, job_id)) == 1
    for job_id in (ids[5], ids[9]):  # at_most_once: failed orphaned only if its body had started
        job = Job.objects.get(pk=job_id)
        runs = len(starts(log, job_id))
        assert runs == 1, (job_id, runs)
        assert job.state == "succeeded" or (job.state, job.failure_reason) == ("failed", "orphaned")
    # Every at_least_once job succeeded in the end.
    assert set(Job.objects.filter(pk__in=ids, kind="probe").values_list("state", flat=True)) == {"succeeded"}
    assert_engine_invariants()
