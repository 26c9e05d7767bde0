"""Running job bodies in the test process through the real runtime (main thread: real SIGALRM)."""

from __future__ import annotations

import time

from workers.models import Job
from workers.runtime import get_runtime


def drain() -> int:
    return get_runtime().drain(first_job_id=None, origin_queue="default")


def run_until(job_id: int, *states: str, timeout: float = 20) -> Job:
    """Drain as the dispatcher's re-rings would, until the job reaches one of ``states``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drain()
        job = Job.objects.get(pk=job_id)
        if job.state in states:
            return job
        time.sleep(0.05)
    job = Job.objects.get(pk=job_id)
    raise AssertionError(f"job {job_id} is {job.state} ({job.error_message or job.park_detail}), not {'/'.join(states)}")
