"""Running job bodies in the test process through the real runtime (main thread: real SIGALRM).

The one home for "drain as a worker would": every test that runs bodies in-process drains
through here instead of calling ``get_runtime().drain`` itself.

These need committed rows (``django_db(transaction=True)``): the claim compares ``scheduled_at``
with PostgreSQL's ``now()``, which stands still inside one transaction (it is the transaction's
start), so a job enqueued inside a test's transaction never falls due there, and a retry's
backoff never runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from io import StringIO
from typing import TYPE_CHECKING

from django.core.management import call_command
from django.db import connections
from django.db.backends.signals import connection_created

from workers.models import TERMINAL_STATES, Job
from workers.runtime import get_runtime

if TYPE_CHECKING:
    from exports.models import Export

POLL_SECONDS = 0.05  # between passes, while a job waits out a retry's backoff (wall time)


def drain(queue: str = "default", *, job_id: int | None = None) -> int:
    """One delivery: claim and run ``job_id`` if given (as a doorbell naming it), then due jobs."""
    if connections["default"].in_atomic_block:
        # Fail at once, not after a timeout: inside the test's transaction nothing falls due.
        raise RuntimeError("running bodies in-process needs committed rows: mark the test django_db(transaction=True)")
    return get_runtime().drain(first_job_id=job_id, origin_queue=queue)


def drain_until[T](
    done: Callable[[], T], *, queue: str = "default", timeout: float = 20.0, what: str | Callable[[], str] = "condition"
) -> T:
    """Drain ``queue`` as the dispatcher's re-rings would, until ``done()`` returns something
    true; return it. ``what`` (a text or a callable giving one) names it in the timeout error."""
    deadline = time.monotonic() + timeout
    while True:
        drain(queue)
        value = done()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(POLL_SECONDS)


def run_until(job_id: int, *states: str, timeout: float = 20.0) -> Job:
    """Drain the job's queue until the job reaches one of ``states`` (any terminal state if none)."""
    wanted = states or tuple(TERMINAL_STATES)
    queue = Job.objects.values_list("queue", flat=True).get(pk=job_id)

    def reached() -> Job | None:
        job = Job.objects.get(pk=job_id)
        return job if job.state in wanted else None

    def where() -> str:
        job = Job.objects.get(pk=job_id)
        return f"job {job_id} to be {'/'.join(wanted)}; it is {job.state} ({job.error_message or job.park_detail})"

    return drain_until(reached, queue=queue, timeout=timeout, what=where)


def run_export(export_id: int, timeout: float = 60.0) -> Export:
    """Run an export's job in this process until it ends; the export record as it ends."""
    from exports.models import Export

    export = Export.objects.get(pk=export_id)
    run_until(export.job_id, timeout=timeout)
    export.refresh_from_db()
    return export


def beat_tick() -> None:
    """One tick of the beat in this process (``koala_beat --once``): reap, the safety layer's
    periodic work, app housekeeping, re-ring due jobs. Instead of sleeping through "several beat
    ticks" and hoping one happened, a test runs one and then asserts."""
    try:
        call_command("koala_beat", "--once", stdout=StringIO())
    finally:
        # The command bounds this process's sessions the way a beat process's are
        # (workers.dbsession); the test process is no beat: later tests keep PostgreSQL's defaults.
        connection_created.disconnect(dispatch_uid="koala-bounded-sessions")
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                with conn.cursor() as cursor:
                    cursor.execute("RESET statement_timeout; RESET lock_timeout; RESET idle_in_transaction_session_timeout")
