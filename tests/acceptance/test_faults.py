"""Fault tests with real worker subprocesses against real PostgreSQL and Redis.

Every test asserts the invariants through database rows (jobs, attempts) and the probe's
effect file (the outside world's record of body executions), never through log lines alone.
Timings come from tests.conftest.worker_env: lease 3 s, heartbeat 0.5 s, grace 0.5 s,
shutdown deadline 3 s, beat every 0.2 s.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction

from tests.conftest import wait_for, worker_env
from tests.inprocess import beat_tick
from tests.support.fleet import (
    assert_engine_invariants,
    attempts,
    ends,
    is_alive,
    job,
    lines,
    pending,
    ring_for,
    rq_workers,
    snapshot,
    starts,
    wait_all_terminal,
    wait_exit,
    wait_listening,
    wait_quiet,
    wait_start,
    wait_state,
    wait_workers_ready,
)
from workers import doorbell, kinds, outcomes
from workers.errors import Rejection
from workers.models import Attempt, FailureReason, Job, Outcome, WorkerProcess
from workers.services import leases
from workers.services.jobs import JobSpec, enqueue, enqueue_many
from workers.transitions import end_attempt

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


# 1 ---------------------------------------------------------------------------------------------
def test_duplicate_delivery_to_two_workers_runs_the_body_once(processes, tmp_path, stray_pids) -> None:
    log = str(tmp_path / "effects.log")
    a = processes.worker("--name", "dup-a")
    b = processes.worker("--name", "dup-b")
    wait_workers_ready([a, b])

    job_id = enqueue(kind="probe", input={"log": log, "seconds": 1}).job_id
    # A second doorbell for the same job while the first is being served: a duplicate delivery.
    assert doorbell.ring("default", [(job_id, 1)], depth=10) == 1
    wait_start(log, job_id)
    done = wait_state(job_id, "succeeded")

    # Both messages were taken, by different workers, while the body ran.
    wait_for(lambda: pending() == 0, what="both messages consumed")
    wait_for(lambda: sum(w.successful_job_count for w in rq_workers().values()) == 2, what="two deliveries handled")
    assert all(w.successful_job_count == 1 for w in rq_workers().values()), "each worker got one of the two messages"

    # A third delivery after success is a no-op as well.
    assert doorbell.ring("default", [(job_id, 1)], depth=10) == 1
    wait_for(lambda: sum(w.successful_job_count for w in rq_workers().values()) == 3, what="late duplicate handled")

    assert len(starts(log, job_id)) == 1
    assert len(ends(log, job_id)) == 1
    tries = attempts(job_id)
    assert [t.outcome for t in tries] == [Outcome.SUCCEEDED]
    assert (done.attempts, done.lease_token) == (1, 1)
    assert job(job_id).result == {"pid": int(starts(log, job_id)[0][3])}
    assert_engine_invariants()


# 2 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "worker_class"),
    [("probe", "simple"), ("probe_once", "simple"), ("probe", "fork"), ("probe_once", "fork")],
)
def test_kill_9_mid_body(processes, tmp_path, stray_pids, kind: str, worker_class: str) -> None:
    """kill -9 of the process running the body (the worker itself, or the fork class's work horse)."""
    log = str(tmp_path / "effects.log")
    processes.beat()
    a = processes.worker("--worker-class", worker_class)
    b = processes.worker("--worker-class", worker_class)
    wait_workers_ready([a, b])

    seconds = 1.5 if kind == "probe" else 10
    job_id = enqueue(kind=kind, input={"log": log, "seconds": seconds}).job_id
    body_pid = int(wait_start(log, job_id)[0][3])
    stray_pids.append(body_pid)
    first = attempts(job_id)[0]
    os.kill(body_pid, signal.SIGKILL)

    if kind == "probe":  # at_least_once: runs again after the lease expires, and succeeds
        done = wait_state(job_id, "succeeded", "failed", timeout=20)
        assert done.state == "succeeded"
        tries = attempts(job_id)
        assert [t.outcome for t in tries] == [Outcome.ORPHANED, Outcome.SUCCEEDED]
        assert done.attempts == 2
        assert tries[0].lease_token == first.lease_token and tries[1].lease_token > first.lease_token
        runs = starts(log, job_id)
        assert len(runs) == 2 and int(runs[0][3]) == body_pid and int(runs[1][3]) != body_pid
        assert [int(e[3]) for e in ends(log, job_id)] == [int(runs[1][3])], "only the second run finished"
        assert done.result == {"pid": int(runs[1][3])}
    else:  # at_most_once: never a second run; failed as orphaned
        done = wait_state(job_id, "succeeded", "failed", timeout=20)
        assert (done.state, done.failure_reason) == ("failed", FailureReason.ORPHANED)
        assert [t.outcome for t in attempts(job_id)] == [Outcome.ORPHANED]
        assert done.attempts == 1
        # A doorbell naming it reaches a live worker and the beat ticks: still nothing runs it again.
        before = snapshot(job_id)
        ring_for("default", [job_id])
        beat_tick()
        wait_quiet("default")
        assert snapshot(job_id) == before
        assert len(starts(log, job_id)) == 1 and ends(log, job_id) == []
    if worker_class == "fork":
        # Killing a work horse leaves its RQ worker serving.
        assert a.poll() is None and b.poll() is None
    assert_engine_invariants()


# 3 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_stopped_worker_past_its_lease_cannot_change_the_outcome(processes, tmp_path, stray_pids, worker_class: str) -> None:
    log = str(tmp_path / "effects.log")
    processes.beat()
    stale = processes.worker("--name", "stale", "--worker-class", worker_class)
    wait_workers_ready([stale])

    job_id = enqueue(kind="probe", input={"log": log, "seconds": 1}).job_id
    stale_pid = int(wait_start(log, job_id)[0][3])
    stray_pids.append(stale_pid)
    os.kill(stale.pid, signal.SIGSTOP)
    if stale_pid != stale.pid:
        os.kill(stale_pid, signal.SIGSTOP)  # the fork class: stop the work horse as well
    stale_token = attempts(job_id)[0].lease_token

    fresh = processes.worker("--name", "fresh", "--worker-class", worker_class)
    done = wait_state(job_id, "succeeded", "failed", timeout=25)
    assert done.state == "succeeded"
    tries = attempts(job_id)
    assert [(t.outcome, t.worker_id) for t in tries] == [(Outcome.ORPHANED, "stale"), (Outcome.SUCCEEDED, "fresh")]
    fresh_pid = int(starts(log, job_id)[1][3])
    assert fresh_pid != stale_pid and done.result == {"pid": fresh_pid}
    before = snapshot(job_id)

    # Wake the stale worker: it resumes mid-body with a superseded lease.
    if stale_pid != stale.pid:
        os.kill(stale_pid, signal.SIGCONT)
    os.kill(stale.pid, signal.SIGCONT)
    # It has finished with the message (its body stopped or ended, its report was refused) once RQ
    # counts the delivery as handled.
    wait_for(
        lambda: getattr(rq_workers().get("stale"), "successful_job_count", 0) == 1,
        timeout=15,
        what="the stale worker to finish its delivery",
    )
    assert snapshot(job_id) == before, "the stale attempt changed the job or its attempts"
    assert stale.poll() is None and fresh.poll() is None, "both workers keep serving"

    # The engine names the rejection for every write the stale attempt could try.
    assert leases.heartbeat(job_id=job_id, lease_token=stale_token, lease_seconds=3) is Rejection.LEASE_SUPERSEDED
    held = leases.lease_of(attempt_id=Attempt.objects.get(job_id=job_id, lease_token=stale_token).pk)
    assert held is not None and held.lease.lease_token == stale_token
    for decision in (
        outcomes.Complete(result={"pid": stale_pid}, state_delta={}),
        outcomes.Fail(reason=FailureReason.FATAL, error_class="X", message="late"),
        outcomes.RetryLater(delay_seconds=0, error_class="X", message="late"),
        outcomes.Release(outcome=Outcome.INTERRUPTED, message=""),
    ):
        assert end_attempt(decision, held.lease) is Rejection.LEASE_SUPERSEDED, decision
    assert snapshot(job_id) == before
    # Extra (not the proof): the stale worker logged the rejection by name.
    assert "lease_superseded" in processes.logs() or "owned by a newer attempt" in processes.logs()
    assert_engine_invariants()


def test_stale_worker_whose_lease_expired_unclaimed_is_told_lease_expired(processes, tmp_path, stray_pids) -> None:
    """No beat while the worker is stopped: its lease expires but nobody took the job yet."""
    log = str(tmp_path / "effects.log")
    stale = processes.worker("--name", "stale")
    wait_workers_ready([stale])
    job_id = enqueue(kind="probe_long_first", input={"log": log, "first_seconds": 30, "first_cooperative": True}).job_id
    wait_start(log, job_id)
    os.kill(stale.pid, signal.SIGSTOP)
    token = attempts(job_id)[0].lease_token
    wait_for(
        lambda: job(job_id).lease_expires_at < datetime.now(job(job_id).lease_expires_at.tzinfo) - timedelta(seconds=0.2),
        timeout=10,
        what="the lease to expire",
    )
    assert leases.heartbeat(job_id=job_id, lease_token=token, lease_seconds=3) is Rejection.LEASE_EXPIRED
    os.kill(stale.pid, signal.SIGCONT)
    # The cooperative body stops at its next check (cancelled after the rejected heartbeat).
    wait_for(
        lambda: getattr(rq_workers().get("stale"), "successful_job_count", 0) == 1,
        timeout=10,
        what="the stale worker to stop the body",
    )
    row = job(job_id)
    assert row.state == "running" and row.lease_token == token, "nothing was reported for the expired attempt"
    assert attempts(job_id)[0].finished_at is None and ends(log, job_id) == []
    # The reaper decides: orphaned and requeued; a worker completes it.
    processes.beat()
    done = wait_state(job_id, "succeeded", timeout=45)
    assert [t.outcome for t in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]
    assert done.attempts == 2
    assert_engine_invariants()


# 4 ---------------------------------------------------------------------------------------------
def _enqueue_probes(log: str, count: int, seconds: float) -> list[int]:
    results = enqueue_many(specs=[JobSpec(kind="probe", input={"log": log, "seconds": seconds, "n": n}) for n in range(count)])
    return [r.job_id for r in results]


def _assert_each_ran_once(log: str, job_ids: list[int]) -> None:
    assert Job.objects.filter(pk__in=job_ids, state="succeeded").count() == len(job_ids)
    started = [int(line[1]) for line in starts(log)]
    finished = [int(line[1]) for line in ends(log)]
    assert sorted(started) == sorted(job_ids), "every job's body started exactly once"
    assert sorted(finished) == sorted(job_ids), "every job's body finished exactly once"
    assert Attempt.objects.filter(job_id__in=job_ids).count() == len(job_ids)
    assert not Attempt.objects.filter(job_id__in=job_ids).exclude(outcome=Outcome.SUCCEEDED).exists()
    assert set(Job.objects.filter(pk__in=job_ids).values_list("attempts", flat=True)) == {1}


def _progress(job_ids: list[int]) -> int:
    return Job.objects.filter(pk__in=job_ids, state="succeeded").count()


def _start_fleet_with_probes(processes, tmp_path) -> tuple[str, list, list[int]]:  # type: ignore[no-untyped-def]
    """Two workers and a beat, then 200 short probe jobs."""
    log = str(tmp_path / "effects.log")
    # Small drain batches: the workers depend on doorbell messages all the way through.
    env = worker_env(KOALA_DRAIN_BATCH="5")
    workers = [processes.worker(env=env), processes.worker(env=env)]
    processes.beat(env=env)
    wait_workers_ready(workers)
    return log, workers, _enqueue_probes(log, 200, seconds=0.02)


def test_redis_flushall_mid_way_loses_and_doubles_nothing(private_redis, processes, tmp_path, stray_pids) -> None:
    log, workers, job_ids = _start_fleet_with_probes(processes, tmp_path)
    client = doorbell.redis_connection()
    for threshold in (30, 80, 130):
        wait_for(lambda t=threshold: _progress(job_ids) >= t, timeout=60, interval=0.02, what=f"{threshold} jobs done")
        client.flushall()
    wait_all_terminal(job_ids, timeout=90)
    _assert_each_ran_once(log, job_ids)
    assert all(w.poll() is None for w in workers), "a FLUSHALL must not kill a worker"
    assert_engine_invariants()


def test_redis_restart_without_persistence_loses_and_doubles_nothing(private_redis, processes, tmp_path, stray_pids) -> None:
    log, workers, job_ids = _start_fleet_with_probes(processes, tmp_path)
    wait_for(lambda: _progress(job_ids) >= 50, timeout=60, interval=0.02, what="50 jobs done")
    private_redis.kill()
    down_at = _progress(job_ids)
    time.sleep(1.0)  # the outage itself: wall time with Redis away (workers see their pops fail)
    private_redis.start()  # same port, empty: every message is gone
    doorbell.reset_connection()
    wait_all_terminal(job_ids, timeout=90)
    assert down_at < len(job_ids), "Redis went down mid-way"
    _assert_each_ran_once(log, job_ids)
    assert all(w.poll() is None for w in workers), "a Redis restart must not kill a worker"
    assert_engine_invariants()


# 5 ---------------------------------------------------------------------------------------------
def test_enqueue_in_a_rolled_back_transaction_never_runs(processes, tmp_path, stray_pids) -> None:
    log = str(tmp_path / "effects.log")
    control_log = str(tmp_path / "control.log")
    worker = processes.worker()
    processes.beat()
    wait_workers_ready([worker])

    def committed_job_meanwhile() -> None:
        # Another connection enqueues and commits while our transaction is open: the worker
        # wakes and drains the queue while the uncommitted row exists.
        try:
            enqueue(kind="probe", input={"log": control_log, "seconds": 0})
        finally:
            connection.close()

    with pytest.raises(RuntimeError, match="caller fails"), transaction.atomic():
        doomed = enqueue(kind="probe", input={"log": log, "seconds": 0})
        other = threading.Thread(target=committed_job_meanwhile)
        other.start()
        other.join()
        wait_for(lambda: len(ends(control_log)) == 1, timeout=20, what="the control job to run")
        ring_for("default", [doomed.job_id])  # a doorbell naming the uncommitted row, handled
        raise RuntimeError("caller fails")

    ring_for("default", [doomed.job_id])  # and one naming the rolled-back row, with a beat tick
    beat_tick()
    wait_quiet("default")
    assert lines(log, "start") == [] and not os.path.exists(log)
    assert not Job.objects.filter(pk=doomed.job_id).exists()
    assert Job.objects.count() == 1 and Attempt.objects.count() == 1  # the control job only
    assert Job.objects.get().input["log"] == control_log
    assert pending() == 0
    assert_engine_invariants()


# 6 ---------------------------------------------------------------------------------------------
def test_retries_backoff_terminal_errors_and_redaction(processes, tmp_path, stray_pids) -> None:
    log = str(tmp_path / "effects.log")
    card = "4111111111111111"
    bearer = "sk9Zq2Lw7Xv4Pp1Rr8Tt"
    worker = processes.worker()
    processes.beat()
    wait_workers_ready([worker])

    backoff_ids = [enqueue(kind="backoff_probe", input={"log": log, "n": n}).job_id for n in range(4)]
    transient_id = enqueue(kind="transient").job_id
    terminal_id = enqueue(kind="terminal").job_id
    boom_id = enqueue(kind="boom", input={"card": card, "bearer": bearer}).job_id
    wait_all_terminal([*backoff_ids, transient_id, terminal_id, boom_id], timeout=60)

    # Retryable errors: full-jitter backoff within [0, min(cap, base * 2**n)], n = attempts used - 1.
    kind = kinds.get("backoff_probe", 1)
    assert kind is not None
    slack = 0.005  # scheduled_at and finished_at come from one statement's now(): only rounding
    delays: list[float] = []
    for job_id in backoff_ids:
        row = job(job_id)
        tries = attempts(job_id)
        assert (row.state, row.failure_reason) == ("failed", FailureReason.ATTEMPTS_EXHAUSTED)
        assert [t.outcome for t in tries] == [Outcome.RETRY] * 3 + [Outcome.FAILED]
        assert row.attempts == row.max_attempts == kind.max_attempts == len(tries)
        recorded = {int(line[2]): datetime.fromisoformat(line[4]) for line in lines(log, "try", job_id)}
        assert sorted(recorded) == [1, 2, 3, 4]
        for number in (2, 3, 4):
            previous = tries[number - 2]
            scheduled = recorded[number]
            delay = (scheduled - previous.finished_at).total_seconds()
            ceiling = min(kind.backoff_cap, kind.backoff_base * 2 ** (number - 2))
            assert -slack <= delay <= ceiling + slack, f"job {job_id} retry after attempt {number - 1}: {delay} > {ceiling}"
            assert tries[number - 1].started_at >= scheduled, "a retry never starts before its scheduled time"
            delays.append(delay)
    assert len(set(delays)) > 1, "the delays are jittered"

    transient = job(transient_id)
    assert (transient.state, transient.failure_reason) == ("failed", FailureReason.ATTEMPTS_EXHAUSTED)
    assert transient.attempts == transient.max_attempts == 4
    assert [t.outcome for t in attempts(transient_id)] == [Outcome.RETRY] * 3 + [Outcome.FAILED]

    terminal = job(terminal_id)
    assert (terminal.state, terminal.failure_reason, terminal.attempts) == ("failed", FailureReason.TERMINAL, 1)
    assert [(t.outcome, t.error_class) for t in attempts(terminal_id)] == [(Outcome.FAILED, "TerminalFailure:unauthorized")]

    boom = job(boom_id)
    assert (boom.state, boom.failure_reason, boom.attempts) == ("failed", FailureReason.FATAL, 1)
    assert boom.error_class == "ValueError" and "charge failed" in boom.error_message
    # Secrets from the input and the error text: in no column of any job or attempt row (the
    # job's own input excepted: the caller stored it there).
    with connection.cursor() as cursor:
        # The search itself works: it finds the secrets where the caller put them.
        cursor.execute(
            "SELECT count(*) FROM workers_job WHERE input::text LIKE %s AND input::text LIKE %s", [f"%{card}%", f"%{bearer}%"]
        )
        assert cursor.fetchone()[0] == 1
        for table in ("workers_job", "workers_attempt"):
            cursor.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema = current_schema()",
                [table],
            )
            columns = [c for (c,) in cursor.fetchall() if not (table == "workers_job" and c == "input")]
            assert len(columns) > 10
            for column in columns:
                for secret in (card, bearer):
                    cursor.execute(f'SELECT count(*) FROM {table} WHERE "{column}"::text LIKE %s', [f"%{secret}%"])
                    assert cursor.fetchone()[0] == 0, f"{secret!r} stored in {table}.{column}"
    # Extra: nor in the worker's log.
    assert card not in processes.logs() and bearer not in processes.logs()
    assert_engine_invariants()


# 7 ---------------------------------------------------------------------------------------------
def test_unservable_version_waits_for_a_worker_that_serves_it(processes, tmp_path, stray_pids) -> None:
    log = str(tmp_path / "effects.log")
    old = processes.worker("--name", "old", env=worker_env(KOALA_TEST_NO_V2="1"))
    wait_workers_ready([old])

    job_id = enqueue(kind="versioned", version=2, input={"log": log}).job_id
    # The old worker takes the doorbell (RQ counts it) but never claims a version it lacks:
    # the job stays queued and due, with no attempt row and no backoff.
    wait_for(
        lambda: pending() == 0 and rq_workers()["old"].successful_job_count >= 1,
        timeout=15,
        what="the old worker to take the doorbell",
    )
    row = job(job_id)
    assert (row.state, row.attempts, attempts(job_id)) == ("queued", 0, [])
    assert row.scheduled_at == row.created_at  # not pushed back by any backoff
    assert lines(log, "v2") == [] and lines(log, "v1") == []

    new = processes.worker("--name", "new")
    processes.beat()
    done = wait_state(job_id, "succeeded", "failed", timeout=30)
    assert done.state == "succeeded"
    assert done.result["served_by"] == "v2"
    tries = attempts(job_id)
    assert [(t.outcome, t.worker_id) for t in tries] == [(Outcome.SUCCEEDED, "new")]
    assert done.attempts == 1
    assert [int(line[2]) for line in lines(log, "v2")] == [new.pid]
    assert_engine_invariants()


# 8 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_sigterm_lets_a_short_body_finish(processes, tmp_path, stray_pids, worker_class: str) -> None:
    log = str(tmp_path / "effects.log")
    worker = processes.worker("--worker-class", worker_class)  # shutdown deadline 3 s (worker_env)
    wait_workers_ready([worker])
    job_id = enqueue(kind="probe", input={"log": log, "seconds": 1.0, "cooperative": False}).job_id
    stray_pids.append(int(wait_start(log, job_id)[0][3]))
    worker.send_signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=10) == 0
    row = job(job_id)
    assert row.state == "succeeded"
    assert [t.outcome for t in attempts(job_id)] == [Outcome.SUCCEEDED]
    assert len(ends(log, job_id)) == 1
    assert WorkerProcess.objects.get(pid=worker.pid).stopped_at is not None
    assert_engine_invariants()


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_sigterm_releases_a_body_past_the_deadline(processes, tmp_path, stray_pids, worker_class: str) -> None:
    log = str(tmp_path / "effects.log")
    worker = processes.worker("--worker-class", worker_class, "--shutdown-deadline", "1")
    wait_workers_ready([worker])
    # Non-cooperative: its first run would take 20 s; a later run takes 0.2 s.
    job_id = enqueue(kind="probe_long_first", input={"log": log, "first_seconds": 20, "seconds": 0.2}).job_id
    body_pid = int(wait_start(log, job_id)[0][3])
    stray_pids.append(body_pid)
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=10) == 0
    assert time.monotonic() - signalled < 6, "released at the deadline, not at the end of the body"
    assert not is_alive(body_pid)
    row = job(job_id)
    assert (row.state, row.attempts) == ("queued", 0)
    assert [t.outcome for t in attempts(job_id)] == [Outcome.INTERRUPTED]
    assert ends(log, job_id) == []

    other = processes.worker("--worker-class", worker_class)
    processes.beat()
    done = wait_state(job_id, "succeeded", timeout=20)
    assert [t.outcome for t in attempts(job_id)] == [Outcome.INTERRUPTED, Outcome.SUCCEEDED]
    assert done.attempts == 1
    runs = starts(log, job_id)
    assert len(runs) == 2 and len(ends(log, job_id)) == 1
    assert done.result == {"pid": int(runs[1][3])}
    assert other.poll() is None
    assert_engine_invariants()


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_sigterm_past_the_deadline_never_reruns_an_at_most_once_body(processes, tmp_path, stray_pids, worker_class: str) -> None:
    """Releasing an interrupted at_most_once body would run it a second time: it must fail instead."""
    log = str(tmp_path / "effects.log")
    worker = processes.worker("--worker-class", worker_class, "--shutdown-deadline", "1")
    processes.beat()
    wait_workers_ready([worker])
    job_id = enqueue(kind="probe_once", input={"log": log, "seconds": 20, "cooperative": False}).job_id
    wait_start(log, job_id)
    worker.send_signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=10) == 0
    other = processes.worker("--worker-class", worker_class)
    wait_workers_ready([other])
    ring_for("default", [job_id])  # another worker listens, a doorbell names the job, the beat ticks
    beat_tick()
    wait_quiet("default")
    row = job(job_id)
    assert row.state == "failed", f"an interrupted at_most_once job must not go back to the queue (state {row.state})"
    assert (row.failure_reason, row.error_class, row.attempts) == (FailureReason.ORPHANED, "Interrupted", 1)
    assert [(t.outcome, t.error_class) for t in attempts(job_id)] == [(Outcome.FAILED, "Interrupted")]
    assert len(starts(log, job_id)) == 1 and ends(log, job_id) == []
    assert_engine_invariants()


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_sigterm_while_redis_is_down_still_finishes_the_body(
    private_redis, processes, tmp_path, stray_pids, worker_class: str
) -> None:
    """RQ records a stop request in Redis from inside its signal handler; with Redis away that
    must not turn into an exception inside the running body (which would fail the job)."""
    log = str(tmp_path / "effects.log")
    worker = processes.worker("--worker-class", worker_class)
    wait_workers_ready([worker])
    job_id = enqueue(kind="probe", input={"log": log, "seconds": 1.5, "cooperative": False}).job_id
    wait_start(log, job_id)
    private_redis.kill()
    worker.send_signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=15) == 0
    row = job(job_id)
    assert (row.state, row.failure_reason) == ("succeeded", None)
    assert [t.outcome for t in attempts(job_id)] == [Outcome.SUCCEEDED]
    assert len(ends(log, job_id)) == 1
    assert_engine_invariants()


# 9 ---------------------------------------------------------------------------------------------
def test_pool_of_two_drains_and_exits_cleanly_on_sigterm(processes, tmp_path, stray_pids) -> None:
    log = str(tmp_path / "effects.log")
    pool = processes.worker("--pool", "2", env=worker_env(KOALA_DRAIN_BATCH="5"))
    processes.beat()
    wait_for(
        lambda: WorkerProcess.objects.filter(stopped_at__isnull=True).count() == 2,
        timeout=20,
        what="two pool workers to register",
    )
    members = list(WorkerProcess.objects.values_list("name", "pid"))
    stray_pids.extend(pid for _, pid in members)
    assert pool.pid not in {pid for _, pid in members}
    wait_listening(workers=2)

    job_ids = _enqueue_probes(log, 50, seconds=0.02)
    wait_all_terminal(job_ids, timeout=60)
    _assert_each_ran_once(log, job_ids)
    used = set(Attempt.objects.filter(job_id__in=job_ids).values_list("worker_id", flat=True))
    assert used <= {name for name, _ in members}

    # SIGTERM while a pool member runs a body shorter than the shutdown deadline (3 s): the pool
    # passes the stop on, the body finishes and is recorded, every process exits.
    last = enqueue(kind="probe", input={"log": log, "seconds": 1.0, "cooperative": False}).job_id
    wait_start(log, last)
    pool.send_signal(signal.SIGTERM)
    assert wait_exit(pool, timeout=15) == 0
    wait_for(lambda: not any(is_alive(pid) for _, pid in members), timeout=5, what="pool workers to exit")
    assert job(last).state == "succeeded" and len(ends(log, last)) == 1
    assert WorkerProcess.objects.filter(stopped_at__isnull=True).count() == 0
    assert_engine_invariants()
