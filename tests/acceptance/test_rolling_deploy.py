"""A rolling deploy: workers serving an old contract version next to one serving the new one.

The doorbell is shared: whichever worker has waited longest takes the next message, so an
old worker takes doorbells for new-version jobs. It must neither claim them (no
``unservable`` attempt, no backoff) nor swallow the doorbell while a capable worker idles.
Measured from rows: an attempt's started_at against the job's created_at (or the moment the
only capable worker became free).
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_for, worker_env
from tests.support.fleet import assert_engine_invariants, attempts, lines, rq_workers, wait_state, wait_workers_ready
from workers.models import Attempt, Job, Outcome
from workers.services.jobs import enqueue

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OLD = {"KOALA_TEST_NO_V2": "1"}  # these workers lack versioned@2


def deliveries(name: str) -> int:
    """RQ's own count of messages a worker has taken (finished without error)."""
    worker = rq_workers()[name]
    return int(worker.successful_job_count) + int(worker.failed_job_count)


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_new_version_jobs_start_at_once_next_to_old_workers(processes, tmp_path, stray_pids, worker_class: str) -> None:
    log = str(tmp_path / "effects.log")
    new = processes.worker("--name", "new", "--worker-class", worker_class)
    wait_workers_ready([new])
    # Started after "new", so each old worker queues behind it at first; after every job "new"
    # goes back to the end of the line and the old workers are offered the next doorbell first.
    old = [processes.worker("--name", f"old-{i}", "--worker-class", worker_class, env=worker_env(**OLD)) for i in range(2)]
    wait_workers_ready([new, *old])
    processes.beat()

    latencies = []
    for _ in range(8):
        job_id = enqueue(kind="versioned", version=2, input={"log": log}).job_id
        done = wait_state(job_id, "succeeded", "failed", timeout=60)
        assert (done.state, done.result["served_by"]) == ("succeeded", "v2")
        ran = attempts(job_id)[-1]
        latencies.append((ran.started_at - done.created_at).total_seconds())
    unservable = Attempt.objects.filter(outcome=Outcome.UNSERVABLE).count()
    print(f"start latencies ({worker_class}): {sorted(latencies)}")  # shown with -s; the assertion decides
    assert (max(latencies) < 1.0, unservable) == (True, 0), f"start latencies {latencies}, unservable attempts {unservable}"
    # One attempt per job, run by the capable worker, and its body ran once.
    assert set(Attempt.objects.values_list("worker_id", "outcome")) == {("new", Outcome.SUCCEEDED)}
    assert Attempt.objects.count() == 8 and len(lines(log, "v2")) == 8
    assert_engine_invariants()


def test_a_doorbell_for_a_busy_capable_worker_does_not_spin_between_old_workers(processes, tmp_path, stray_pids) -> None:
    new = processes.worker("--name", "new")
    old = [processes.worker("--name", f"old-{i}", env=worker_env(**OLD)) for i in range(2)]
    wait_workers_ready([new, *old])
    processes.beat()

    busy = enqueue(kind="versioned", version=2, input={"seconds": 3}).job_id
    wait_state(busy, "running", timeout=20)
    before = sum(deliveries(f"old-{i}") for i in range(2))
    waiting = enqueue(kind="versioned", version=2, input={}).job_id
    done = wait_state(waiting, "succeeded", "failed", timeout=60)
    wait_for(lambda: not Job.objects.exclude(state="succeeded").exists(), timeout=30, what="both jobs to finish")
    spent = sum(deliveries(f"old-{i}") for i in range(2)) - before

    first = attempts(busy)[-1]
    second = attempts(waiting)[-1]
    assert first.finished_at is not None
    # The waiting job starts as soon as the capable worker is free (its own drain finds it) ...
    wait_after_free = (second.started_at - first.finished_at).total_seconds()
    unservable = Attempt.objects.filter(outcome=Outcome.UNSERVABLE).count()
    assert (done.state, unservable, wait_after_free < 1.0) == ("succeeded", 0, True), (unservable, wait_after_free)
    # ... and meanwhile the old workers passed its doorbell on a bounded number of times per ring
    # (the beat rings every 0.2 s here; each ring is passed on at most once per old worker), not in
    # a loop between themselves.
    assert spent <= 3 / 0.2 * 3, f"old workers took {spent} doorbells in ~3 s"
    assert_engine_invariants()
