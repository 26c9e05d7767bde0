"""Export faults with real worker subprocesses, real PostgreSQL, Redis and file systems.

The workers load tests.support.export_faults, which only *delays* the body at the points it announces
(between batches, at each phase) and logs them: the outside record the assertions use along
with database rows and the files in the storage folder. Timings come from tests.conftest.worker_env
(lease 3 s, heartbeat 0.5 s, beat every 0.2 s) and KOALA_EXPORT_BATCH_ROWS=5000.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exports.models import Export, ExportState
from exports.services import cancel_export
from tests.conftest import Processes, wait_for
from tests.support.exports import Faults, People, direct_copy, load_events, published, request, sha256, temp_files
from tests.support.fleet import attempts, is_alive, wait_all_terminal, wait_quiet, wait_state, wait_workers_ready
from workers.models import Job, Operation
from workers.services.budgets import create_budget
from workers.services.jobs import enqueue

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def start_workers(processes: Processes, env: dict[str, str], count: int = 2, queues: str = "exports") -> list[Any]:
    processes.beat(env=env)
    workers = [processes.start("koala_worker", "--queues", queues, env=env, name=f"worker{n}") for n in range(count)]
    wait_workers_ready(workers)
    return workers


def wait_phase(faults: Faults, export_id: int, attempt: int, phase: str, timeout: float = 30) -> int:
    """Wait for a phase line; returns the pid of the process that reached it."""

    def reached() -> int | None:
        for line in faults.lines("phase", export_id):
            if int(line[2]) == attempt and line[3] == phase:
                return int(line[5])
        return None

    return int(wait_for(reached, timeout=timeout, what=f"export {export_id} attempt {attempt} to reach {phase}"))  # type: ignore[arg-type]


def wait_batches(faults: Faults, export_id: int, attempt: int, count: int, timeout: float = 30) -> list[list[str]]:
    def enough() -> list[list[str]] | None:
        found = [line for line in faults.lines("batch", export_id) if int(line[2]) == attempt]
        return found if len(found) >= count else None

    return wait_for(enough, timeout=timeout, what=f"{count} batches of export {export_id}")  # type: ignore[return-value]


def finished(export_id: int, timeout: float = 60) -> Export:
    export = Export.objects.get(pk=export_id)
    wait_state(export.job_id, "succeeded", "failed", "cancelled", timeout=timeout)
    export.refresh_from_db()
    return export


# Test 2 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["staged", "object_written", "published"])
def test_kill_9_after_the_object_is_written_before_completion(
    people: People, export_root: Path, processes: Processes, export_env: dict[str, str], faults: Faults, phase: str
) -> None:
    """staged: the complete temp object is named on the export row, nothing is published yet.
    object_written: the final object exists, the ledger still says in_flight (reconcile finds it).
    published: the ledger says succeeded, the export row does not (the stored result is reused)."""
    load_events(people.acme, rows=50_000)
    faults.set(pause_at=phase, pause_attempts=[1], pause_seconds=60)
    start_workers(processes, export_env)
    export = request(people)

    pid = wait_phase(faults, export.pk, 1, phase)
    if phase == "staged":
        assert published(export_root) == [] and len(temp_files(export_root)) == 1
    else:
        assert [p.name for p in published(export_root)] == [f"export-{export.pk}.csv"], "the object is written"
    assert Export.objects.get(pk=export.pk).state == ExportState.RUNNING, "…and the completion is not"
    os.kill(pid, signal.SIGKILL)

    done = finished(export.pk)
    source = direct_copy(people.acme)
    assert done.state == ExportState.SUCCEEDED, (done.failure_code, done.error_message)
    assert (done.checksum, done.bytes, done.row_count) == (sha256(source), len(source), 50_000)
    files = published(export_root)
    assert len(files) == 1 and sha256(files[0].read_bytes()) == sha256(source), "exactly one published object"
    assert temp_files(export_root) == []
    assert [a.outcome for a in attempts(done.job_id)] == ["orphaned", "succeeded"]
    # The replacement did not stream again: it found the object (or the ledger's record of it).
    phases = faults.phases(export.pk)
    assert (2, "streaming") not in phases and phases.count((2, "completed")) == 1
    assert [p for p in phases if p[1] == "completed"] == [(2, "completed")], "the export completed once"
    op = Operation.objects.get(job_id=done.job_id)
    assert op.state == ("reconciled" if phase == "object_written" else "succeeded")
    assert op.attempts == 1, "published once: by attempt 1, or (staged) by attempt 2"
    assert op.params["sha256"] == done.checksum


# Test 3 ------------------------------------------------------------------------------------------
def test_kill_9_mid_stream_publishes_nothing_partial_and_the_retry_cleans_up(
    people: People, export_root: Path, processes: Processes, export_env: dict[str, str], faults: Faults
) -> None:
    load_events(people.acme, rows=60_000)
    faults.set(throttle_seconds=0.2, throttle_attempts=[1])  # 12 batches of 5,000 rows: ~2.4 s
    start_workers(processes, export_env)
    export = request(people)

    batches = wait_batches(faults, export.pk, 1, 3)
    partial = temp_files(export_root)
    assert len(partial) == 1 and partial[0].stat().st_size > 0, "attempt 1 is writing its temporary object"
    assert published(export_root) == []
    killed = int(batches[0][7])
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: not is_alive(killed), timeout=10, what=f"worker {killed} to die")
    assert published(export_root) == [] and partial[0].exists(), "a killed attempt leaves its temp file, never a final one"

    done = finished(export.pk)
    source = direct_copy(people.acme)
    assert (done.state, done.checksum, done.row_count) == (ExportState.SUCCEEDED, sha256(source), 60_000)
    assert len(published(export_root)) == 1
    assert not partial[0].exists() and temp_files(export_root) == [], "the dead attempt's temp file was removed"
    assert [a.outcome for a in attempts(done.job_id)] == ["orphaned", "succeeded"]
    assert done.attempts == 2


# Test 4 ------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, created (and removed) by the test."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs here (needs root with CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_disk_full_fails_transiently_then_succeeds_once_space_is_freed(
    people: People, tiny_filesystem: Path, processes: Processes, faults: Faults, export_env: dict[str, str]
) -> None:
    load_events(people.acme, rows=15_000)  # ~1.1 MB of CSV
    source = direct_copy(people.acme)
    filler = tiny_filesystem / "filler"
    filler.write_bytes(b"\0" * (1536 * 1024))  # leaves ~0.5 MB: not enough
    env = {**export_env, "KOALA_EXPORT_ROOT": str(tiny_filesystem)}
    start_workers(processes, env)
    export = request(people)

    def retries() -> list[Any]:
        return [a for a in attempts(export.job_id) if a.outcome == "retry"]

    wait_for(lambda: len(retries()) >= 2, timeout=30, what="two transient failures")
    for attempt in retries():
        assert attempt.error_class == "Retryable" and "ENOSPC" in attempt.error_message, attempt.error_message
    assert not (tiny_filesystem / "exports").exists() or not any((tiny_filesystem / "exports").rglob("*.csv"))
    assert temp_files(tiny_filesystem) == [], "a failed attempt removes its partial temp file"
    filler.unlink()

    done = finished(export.pk)
    assert (done.state, done.checksum, done.bytes) == (ExportState.SUCCEEDED, sha256(source), len(source))
    assert published(tiny_filesystem) == [tiny_filesystem / done.output_key]
    assert temp_files(tiny_filesystem) == []
    outcomes = [a.outcome for a in attempts(done.job_id)]
    assert outcomes[-1] == "succeeded" and set(outcomes[:-1]) == {"retry"} and len(outcomes) >= 3


# Test 5 ------------------------------------------------------------------------------------------
def test_cancellation_mid_export_stops_within_one_batch(
    people: People, export_root: Path, processes: Processes, export_env: dict[str, str], faults: Faults
) -> None:
    load_events(people.acme, rows=100_000)
    faults.set(throttle_seconds=0.2)  # 20 batches: ~4 s
    start_workers(processes, export_env, count=1)
    export = request(people)

    wait_batches(faults, export.pk, 1, 3)
    cancelled_at = time.time()
    assert cancel_export(export_id=export.pk, user=people.alice, reason="not needed").state == ExportState.CANCELLED
    wait_for(lambda: temp_files(export_root) == [], timeout=10, what="the body to stop and remove its temp file")
    wait_quiet("exports")  # the worker is done with the delivery: any further batch would be logged by now

    lines = faults.lines("batch", export.pk) + faults.lines("phase", export.pk)
    events = sorted(lines, key=lambda line: float(line[-2]))
    stopped = [n for n, line in enumerate(events) if line[0] == "phase" and line[3] == "stopped"]
    assert stopped, "the body noticed the cancellation at a batch boundary (not cut off by the runtime later)"
    assert events[stopped[0] + 1 :] == [], "no batch was streamed after it stopped"
    stopped_after = float(events[stopped[0]][4]) - cancelled_at
    # Told at the next heartbeat (every 0.5 s), then stopped at the end of the batch in progress (0.2 s).
    assert stopped_after < 0.5 + 0.2 + 0.5, f"took {stopped_after:.2f}s"
    assert len(faults.lines("batch", export.pk)) < 20
    done = Export.objects.get(pk=export.pk)
    assert done.state == ExportState.CANCELLED and published(export_root) == [] and temp_files(export_root) == []
    assert [a.outcome for a in attempts(done.job_id)] == ["cancelled"]
    assert (1, "staged") not in faults.phases(export.pk)


# Test 8 ------------------------------------------------------------------------------------------
def test_small_default_jobs_keep_completing_while_large_exports_run(
    people: People, export_root: Path, processes: Processes, export_env: dict[str, str], faults: Faults
) -> None:
    """Two workers serve both queues. The exports queue has its own budget (one export at a time),
    so while two large exports wait their turn, one worker stays free for the small jobs."""
    create_budget(name="exports queue", scope="queue", target="exports", concurrency_limit=1, actor="test")
    load_events(people.acme, rows=100_000)
    faults.set(throttle_seconds=0.2)  # 20 batches: ~4 s per export
    start_workers(processes, export_env, count=2, queues="default,exports")

    def small_job_latencies(count: int = 12, gap: float = 0.15) -> list[float]:
        ids = []
        for n in range(count):
            ids.append(enqueue(kind="noop", input={"n": n}).job_id)
            running = Job.objects.filter(queue="exports", state="running").count()
            assert running <= 1, f"{running} exports ran at once"
            time.sleep(gap)  # wall time on purpose: small jobs arriving spread out, while exports stream
        wait_all_terminal(ids, timeout=30)
        jobs = Job.objects.filter(pk__in=ids)
        assert {j.state for j in jobs} == {"succeeded"}
        return [(j.finished_at - j.created_at).total_seconds() for j in jobs]

    baseline = small_job_latencies()
    bound = 3 * max(baseline) + 0.5
    exports = [request(people), request(people)]
    wait_phase(faults, exports[0].pk, 1, "streaming")
    during = small_job_latencies()
    busy = Export.objects.filter(pk__in=[e.pk for e in exports], state=ExportState.RUNNING).count()
    assert busy == 1, "the small jobs were measured while an export was streaming"
    assert max(during) <= bound, f"small jobs waited {max(during):.2f}s with exports running; bound {bound:.2f}s ({baseline=})"

    done = [finished(e.pk, timeout=60) for e in exports]
    assert [d.state for d in done] == [ExportState.SUCCEEDED, ExportState.SUCCEEDED]
    # One at a time: the second export started streaming only after the first had completed.
    times = {(int(line[1]), line[3]): float(line[4]) for line in faults.lines("phase")}
    first, second = sorted(done, key=lambda d: times[(d.pk, "streaming")])
    assert times[(second.pk, "streaming")] >= times[(first.pk, "completed")]
