"""What a worker logs per job: one Koala line per attempt naming the job, its kind and attempt; none of RQ's doorbell lines.

RQ's own INFO lines ("default: koala job 14 (uuid)", "Successfully completed koala job 14 job in …",
"Job OK", "result discarded immediately") name the doorbell message, three or four per job, and
buried `make run`'s login within seconds; at INFO a person reads Koala's lines only.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import Processes
from workers.services.jobs import enqueue

# transaction=True: worker subprocesses must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def burst_worker_output(processes: Processes) -> str:
    worker = processes.worker("--burst", "--name", "log-probe")
    try:
        assert worker.wait(timeout=60) == 0, processes.logs()
    except subprocess.TimeoutExpired:
        raise AssertionError(processes.logs()) from None
    return processes.logs()


def test_each_attempt_is_one_line_naming_job_kind_and_attempt_and_rq_stays_quiet(processes: Processes) -> None:
    ok = enqueue(kind="noop", input={}).job_id
    failed = enqueue(kind="terminal", input={}).job_id
    retried = enqueue(kind="transient", input={}).job_id
    logs = burst_worker_output(processes)  # LOG_LEVEL=INFO (tests/conftest.py worker_env)

    expected = [
        rf"INFO koala\.worker job {ok} \(noop, attempt 1\) succeeded in \d+ ms",
        rf"WARNING koala.worker job {failed} \(terminal, attempt 1\) failed in \d+ ms: terminal \(TerminalFailure:unauthorized\)",
        rf"INFO koala\.worker job {retried} \(transient, attempt 1\) failed in \d+ ms \(Retryable\); retry in \d+\.\d s",
    ]
    for pattern in expected:
        assert re.search(pattern, logs), (pattern, logs)
    rq_lines = [line for line in logs.splitlines() if " rq." in line]
    assert rq_lines == [], rq_lines
