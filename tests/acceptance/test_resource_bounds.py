"""Per-attempt memory and CPU ceilings, enforced by the fork worker's work horse (workers/bounds.py).

Real worker and beat processes. A body that allocates past its ceiling and one that spins past it
each end with a named reason (never a silent crash), whether the body was told (MemoryError,
SIGXCPU) or its horse died of it (the parent names it); the job follows its retry policy; the same
worker serves the next job; the circuit breaker counts these endings; a kind's own ceiling beats
the setting; a bad setting stops start-up with a clear message; the simple worker says it enforces
none.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tests.bounds_kinds  # noqa: F401  (registers the kinds this process enqueues)
from tests.conftest import REPO, Processes, wait_for, worker_env
from tests.kinds import effect_lines
from workers.models import Attempt, FailureReason, Job, JobState, Pause, PauseSource
from workers.services import pauses
from workers.services.jobs import enqueue

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KINDS = "workers.builtin_kinds,tests.kinds,tests.bounds_kinds"
NAME = "bounds-probe"


def bounded_env(**extra: str) -> dict[str, str]:
    return worker_env(KOALA_JOB_KIND_MODULES=KINDS, KOALA_BREAKER_THRESHOLD="0", **extra)


def start(processes: Processes, *, worker_class: str = "fork", **extra: str) -> None:
    env = bounded_env(**extra)
    processes.worker("--worker-class", worker_class, "--name", NAME, env=env)
    processes.beat(env=env)  # rings the doorbell for the retries as they come due


def settled(job_id: int, processes: Processes, timeout: float = 60.0) -> Job:
    def done() -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if job.state in (JobState.SUCCEEDED, JobState.FAILED) else None

    try:
        return wait_for(done, timeout=timeout, what=f"job {job_id} to finish")  # type: ignore[return-value]
    except AssertionError:
        raise AssertionError(processes.logs()) from None


def attempts(job_id: int) -> list[dict[str, Any]]:
    return list(
        Attempt.objects.filter(job_id=job_id).order_by("id").values("outcome", "error_class", "error_message", "worker_id")
    )


def ends(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(a["outcome"], a["error_class"]) for a in rows]


def assert_next_job_served_by_the_same_worker(tmp_path: Path, processes: Processes) -> None:
    log = str(tmp_path / "ok.log")
    job_id = enqueue(kind="bounds.ok", input={"log": log}).job_id
    job = settled(job_id, processes)
    assert job.state == JobState.SUCCEEDED, attempts(job_id)
    assert [a["worker_id"] for a in attempts(job_id)] == [NAME]


def test_an_allocation_past_the_memory_ceiling_is_named_retried_and_the_worker_serves_on(
    tmp_path: Path, processes: Processes
) -> None:
    start(processes)
    log = str(tmp_path / "effects.log")
    job_id = enqueue(kind="bounds.allocate", input={"log": log, "mb": 256}).job_id
    job = settled(job_id, processes)

    assert job.state == JobState.FAILED
    assert job.failure_reason == FailureReason.MEMORY_LIMIT
    rows = attempts(job_id)
    assert [(a["outcome"], a["error_class"]) for a in rows] == [
        ("retry", "MemoryLimitExceeded"),
        ("failed", "MemoryLimitExceeded"),
    ]
    assert "memory ceiling of 64 MiB" in rows[0]["error_message"]
    assert all(a["worker_id"] == NAME for a in rows)
    assert len(effect_lines(log)) == 2  # the body ran once per attempt: the retry policy (max_attempts=2)
    assert_next_job_served_by_the_same_worker(tmp_path, processes)
    logs = processes.logs()
    assert f"job {job_id} (bounds.allocate, attempt 1, queue default) failed in" in logs
    assert f"job {job_id} (bounds.allocate, attempt 2, queue default) failed in" in logs
    assert ": memory_limit (MemoryLimitExceeded)" in logs


def test_a_spin_past_the_cpu_ceiling_is_told_by_sigxcpu_named_and_retried(tmp_path: Path, processes: Processes) -> None:
    start(processes)
    log = str(tmp_path / "effects.log")
    job_id = enqueue(kind="bounds.spin", input={"log": log}).job_id
    job = settled(job_id, processes)

    assert job.state == JobState.FAILED
    assert job.failure_reason == FailureReason.CPU_LIMIT
    rows = attempts(job_id)
    assert ends(rows) == [("retry", "CpuLimitExceeded"), ("failed", "CpuLimitExceeded")]
    assert rows[0]["error_message"] == "the attempt went past its CPU-time ceiling of 1 s"  # told: not killed
    assert len(effect_lines(log)) == 2
    assert_next_job_served_by_the_same_worker(tmp_path, processes)


def test_a_horse_killed_at_the_cpu_hard_limit_is_named_by_its_parent(tmp_path: Path, processes: Processes) -> None:
    """Spinning inside one C call, the body never sees SIGXCPU; the kernel's SIGKILL at the hard
    limit ends the horse, and the worker (the horse's parent) records the named reason at once.
    Such a body holds the GIL, so its horse's heartbeats stop too: the lease must outlast the
    ceiling and its grace (1 + 2 s here), or the reaper takes the attempt first (orphaned)."""
    start(processes, KOALA_LEASE_SECONDS="20")  # wall time: a loaded machine stretches the 3 CPU seconds
    log = str(tmp_path / "effects.log")
    job_id = enqueue(kind="bounds.spin_natively", input={"log": log}).job_id
    job = settled(job_id, processes)

    assert job.state == JobState.FAILED
    assert job.failure_reason == FailureReason.CPU_LIMIT
    rows = attempts(job_id)
    assert ends(rows) == [("retry", "CpuLimitExceeded"), ("failed", "CpuLimitExceeded")]
    assert all(a["error_message"].endswith("; the work horse was killed") for a in rows), rows
    pids = {line[3] for line in effect_lines(log)}
    assert len(pids) == 2  # each attempt in its own horse: the first one died
    assert_next_job_served_by_the_same_worker(tmp_path, processes)


def test_a_horse_that_aborts_on_a_failed_native_allocation_is_named_by_its_parent(tmp_path: Path, processes: Processes) -> None:
    start(processes)
    log = str(tmp_path / "effects.log")
    job_id = enqueue(kind="bounds.allocate_natively", input={"log": log, "mb": 256}).job_id
    job = settled(job_id, processes)

    assert job.state == JobState.FAILED
    assert job.failure_reason == FailureReason.MEMORY_LIMIT
    rows = attempts(job_id)
    assert [(a["outcome"], a["error_class"]) for a in rows] == [
        ("retry", "MemoryLimitExceeded"),
        ("failed", "MemoryLimitExceeded"),
    ]
    assert all(a["error_message"].endswith("; the work horse was killed") for a in rows), rows
    assert_next_job_served_by_the_same_worker(tmp_path, processes)


def test_the_circuit_breaker_counts_ceiling_breaches(tmp_path: Path, processes: Processes) -> None:
    start(processes)
    log = str(tmp_path / "effects.log")
    ids = [enqueue(kind="bounds.allocate", input={"log": log, "mb": 256}).job_id for _ in range(2)]
    for job_id in ids:
        settled(job_id, processes)
    # Four attempts, each past the ceiling (two retried, two failed memory_limit): a crash streak.
    tripped = pauses.trip_breakers(threshold=4)
    assert [p.target for p in tripped] == ["bounds.allocate"]
    assert Pause.objects.filter(target="bounds.allocate", source=PauseSource.CIRCUIT_BREAKER).exists()


def test_a_kinds_own_ceiling_beats_the_setting(tmp_path: Path, processes: Processes) -> None:
    start(processes, KOALA_ATTEMPT_MEMORY_LIMIT_MB="16")
    log = str(tmp_path / "effects.log")
    under_setting = enqueue(kind="bounds.allocate_default", input={"log": log, "mb": 64}).job_id
    roomy = enqueue(kind="bounds.allocate_roomy", input={"log": log, "mb": 64}).job_id
    unbounded = enqueue(kind="bounds.allocate_unbounded", input={"log": log, "mb": 64}).job_id

    failed = settled(under_setting, processes)
    assert (failed.state, failed.failure_reason) == (JobState.FAILED, FailureReason.MEMORY_LIMIT)
    assert "memory ceiling of 16 MiB" in failed.error_message
    assert settled(roomy, processes).state == JobState.SUCCEEDED  # its 512 MiB beats the setting's 16
    assert settled(unbounded, processes).state == JobState.SUCCEEDED  # its 0 (none) beats the setting


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KOALA_ATTEMPT_MEMORY_LIMIT_MB", "-1", "KOALA_ATTEMPT_MEMORY_LIMIT_MB=-1 must be at least 0."),
        ("KOALA_ATTEMPT_CPU_LIMIT_SECONDS", "ten", "KOALA_ATTEMPT_CPU_LIMIT_SECONDS"),
        ("KOALA_LOG_FORMAT", "xml", "KOALA_LOG_FORMAT='xml' is not one of plain, json."),
    ],
)
def test_a_bad_setting_stops_start_up_with_a_clear_message(name: str, value: str, message: str) -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "koala_worker", "--burst"],
        cwd=REPO,
        env=bounded_env(**{name: value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run
    assert run.stderr.startswith("Koala configuration error: "), run.stderr
    assert message in run.stderr
    assert "Traceback" not in run.stderr


def test_the_simple_worker_says_it_enforces_no_ceiling(processes: Processes) -> None:
    proc = processes.worker("--burst", "--name", NAME, env=bounded_env(KOALA_ATTEMPT_CPU_LIMIT_SECONDS="30"))
    assert proc.wait(timeout=60) == 0, processes.logs()
    logs = processes.logs()
    assert "worker class 'simple' enforces no per-attempt memory or CPU ceiling" in logs
    assert "KOALA_ATTEMPT_CPU_LIMIT_SECONDS=30" in logs
    assert "use --worker-class fork" in logs


def test_cpu_limited_jobs_each_run_in_a_fresh_horse_and_their_batch_is_given_back(tmp_path: Path, processes: Processes) -> None:
    """A CPU hard limit can only be lowered: a CPU-limited attempt is the last its horse runs; the
    batch's other claimed jobs go back unstarted (no attempt used) and run in the next horses."""
    log = str(tmp_path / "effects.log")
    ids = [enqueue(kind="noop", input={}).job_id for _ in range(6)]
    ids += [enqueue(kind="bounds.ok", input={"log": log}).job_id for _ in range(3)]
    ids += [enqueue(kind="noop", input={}).job_id for _ in range(6)]
    start(processes)
    jobs = [settled(job_id, processes) for job_id in ids]
    assert all(job.state == JobState.SUCCEEDED and job.attempts == 1 for job in jobs), [(j.pk, j.state, j.attempts) for j in jobs]
    assert not Attempt.objects.filter(job_id__in=ids, outcome="orphaned").exists()
    pids = [line[3] for line in effect_lines(log)]
    assert len(pids) == 3 and len(set(pids)) == 3, pids  # one horse each
