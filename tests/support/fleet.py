"""Helpers for the acceptance tier: the outside world's record (effect files), the engine's
record (database rows) and process handling. Assertions use rows and effect files, not logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

from rq import Worker as RQWorker

from tests.conftest import wait_for
from tests.kinds import effect_lines
from workers import doorbell
from workers.models import Attempt, Job, JobState, Outcome, WorkerProcess

# Outcomes that hand the job back without using an attempt.
NOT_COUNTED = {Outcome.UNSERVABLE, Outcome.INTERRUPTED, Outcome.PARKED}


# -- the outside world ------------------------------------------------------------------------
def lines(log: str | Path, what: str, job_id: int | None = None) -> list[list[str]]:
    """Effect lines of one type ('start', 'end', 'try', 'v2', ...), optionally for one job."""
    return [line for line in effect_lines(str(log)) if line and line[0] == what and (job_id is None or line[1] == str(job_id))]


def starts(log: str | Path, job_id: int | None = None) -> list[list[str]]:
    return lines(log, "start", job_id)


def ends(log: str | Path, job_id: int | None = None) -> list[list[str]]:
    return lines(log, "end", job_id)


def wait_start(log: str | Path, job_id: int, count: int = 1, timeout: float = 20.0) -> list[list[str]]:
    wait_for(lambda: len(starts(log, job_id)) >= count, timeout=timeout, what=f"{count} start line(s) for job {job_id}")
    return starts(log, job_id)


# -- the engine's record ----------------------------------------------------------------------
def job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def attempts(job_id: int) -> list[Attempt]:
    return list(Attempt.objects.filter(job_id=job_id).order_by("number"))


def wait_state(job_id: int, *states: str, timeout: float = 30.0) -> Job:
    def reached() -> Job | None:
        row = job(job_id)
        return row if row.state in states else None

    return wait_for(reached, timeout=timeout, what=f"job {job_id} to reach {'/'.join(states)}")  # type: ignore[return-value]


def wait_all_terminal(job_ids: Iterable[int], timeout: float = 60.0) -> None:
    ids = list(job_ids)
    wait_for(
        lambda: not Job.objects.filter(pk__in=ids).exclude(state__in=["succeeded", "failed", "cancelled"]).exists(),
        timeout=timeout,
        interval=0.1,
        what=f"{len(ids)} jobs to finish",
    )


def snapshot(job_id: int) -> tuple[dict, list[dict]]:
    """Every column of the job and its attempts: to prove that nothing changed."""
    return (
        Job.objects.filter(pk=job_id).values().get(),
        list(Attempt.objects.filter(job_id=job_id).order_by("number").values()),
    )


def assert_engine_invariants() -> None:
    """Rules that hold for every job after every scenario in this tier (none uses operator requeue)."""
    for row in Job.objects.all():
        tries = attempts(row.pk)
        where = f"job {row.pk} ({row.kind}, {row.state})"
        assert [a.number for a in tries] == list(range(1, len(tries) + 1)), where
        tokens = [a.lease_token for a in tries]
        assert tokens == sorted(set(tokens)), f"{where}: lease tokens must be unique and increasing: {tokens}"
        if tries:
            assert tries[-1].lease_token == row.lease_token, f"{where}: the last attempt holds the current token"
        used = [a for a in tries if a.outcome not in NOT_COUNTED]
        assert row.attempts == len(used), f"{where}: attempts={row.attempts} but {len(used)} counted attempt rows"
        assert row.attempts <= row.max_attempts, where
        live = [a for a in tries if a.finished_at is None]
        assert len(live) <= 1, where
        if row.state == JobState.RUNNING:
            assert live and live[0].lease_token == row.lease_token, f"{where}: a running job has its live attempt"
        else:
            assert not live, f"{where}: only a running job may have an unfinished attempt"
        succeeded = [a for a in tries if a.outcome == Outcome.SUCCEEDED]
        if row.state == JobState.SUCCEEDED:
            assert len(succeeded) == 1 and tries[-1].outcome == Outcome.SUCCEEDED, f"{where}: {[a.outcome for a in tries]}"
        else:
            assert not succeeded, f"{where}: only a succeeded job has a succeeded attempt"


# -- Redis ----------------------------------------------------------------------------------------
def rq_workers() -> dict[str, RQWorker]:
    return {w.name: w for w in RQWorker.all(connection=doorbell.redis_connection())}


def pending(queue: str = "default") -> int:
    return doorbell.rq_queue(queue).count


def listening() -> int:
    """Clients of this Redis database blocked in a pop: workers waiting for a doorbell."""
    client = doorbell.redis_connection()
    db = str(client.connection_pool.connection_kwargs.get("db", 0))
    return sum(1 for c in client.client_list() if c.get("db") == db and "b" in c.get("flags", ""))


def live_rq_workers() -> list[RQWorker]:
    """RQ's registered workers whose process still runs (a killed one stays registered for a while)."""
    return [w for w in rq_workers().values() if w.pid and is_alive(w.pid)]


def wait_listening(workers: int = 0, timeout: float = 10.0) -> None:
    """At least ``workers`` live RQ workers, and every one that RQ calls idle blocked in its pop:
    a doorbell rung now is taken at once."""

    def listened() -> bool:
        live = live_rq_workers()
        return len(live) >= workers and listening() >= sum(1 for w in live if w.get_state() == "idle")

    wait_for(listened, timeout=timeout, interval=0.02, what="idle workers to block in their pop")


def wait_quiet(*queues: str, timeout: float = 20.0) -> None:
    """Every doorbell rung so far has been handled: none is pending on ``queues`` ("default" if
    none named) and every live worker is back in its blocking pop. What a test waits for instead
    of sleeping through "a few doorbells": a message is popped only by a worker that then stops
    listening until it is done with it."""
    names = queues or ("default",)

    def quiet() -> bool:
        if any(pending(q) for q in names):
            return False
        workers = live_rq_workers()
        return all(w.get_state() == "idle" for w in workers) and listening() >= len(workers)

    wait_for(quiet, timeout=timeout, interval=0.05, what=f"every doorbell on {'/'.join(names)} to be handled")


def ring_for(queue: str, job_ids: Iterable[int]) -> None:
    """A doorbell naming each job (as a stale or duplicate message would), and back once a
    worker has handled every one: the strongest nudge to run a job that must not run."""
    ids = list(job_ids)
    versions = dict(Job.objects.filter(pk__in=ids).values_list("pk", "version"))
    rung = doorbell.ring(queue, [(job_id, versions.get(job_id, 1)) for job_id in ids], depth=pending(queue) + len(ids))
    assert rung == len(ids), f"rang {rung} of {len(ids)} doorbells"
    wait_quiet(queue)


# -- processes ------------------------------------------------------------------------------------
def wait_workers_ready(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    """Ready: registered (WorkerProcess row) and listening (RQ reports the worker idle in Redis)."""
    procs_list = list(procs)
    pids = {p.pid for p in procs_list}

    def ready() -> bool:
        for proc in procs_list:
            if proc.poll() is not None:
                raise AssertionError(f"worker {proc.pid} exited early with {proc.returncode}")
        names = dict(WorkerProcess.objects.filter(pid__in=pids, stopped_at__isnull=True).values_list("pid", "name"))
        if set(names) != pids:
            return False
        known = rq_workers()
        return all(name in known and known[name].get_state() == "idle" for name in names.values())

    wait_for(ready, timeout=timeout, interval=0.05, what="workers to register")
    wait_listening(timeout=timeout)  # from 'idle' to the blocking pop


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"process {proc.pid} did not exit within {timeout}s") from None


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_if_ours(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process this test started (a work horse or pool child), if it still runs manage.py."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"manage.py" not in handle.read():
                return
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, sig)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (work horses, pool members, their helpers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    pending_pids = [pid]
    while pending_pids:
        for child in children.get(pending_pids.pop(), []):
            found.append(child)
            pending_pids.append(child)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
