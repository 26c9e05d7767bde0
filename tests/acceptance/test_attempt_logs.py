"""What a worker logs per job: one Koala line per attempt outcome naming the job, its attempt, kind,
queue, outcome, reason and time split; none of RQ's doorbell lines; routine per-job lines at DEBUG;
with KOALA_LOG_FORMAT=json every line of the process a JSON object, the outcome's fields its keys,
masked like the plain text.

RQ's own INFO lines ("default: koala job 14 (uuid)", "Successfully completed koala job 14 job in …",
"Job OK", "result discarded immediately") name the doorbell message, three or four per job, and
buried `make run`'s login within seconds; at INFO a person reads Koala's lines only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from devtools.servers import wait_listening
from tests.conftest import REPO, Processes, worker_env
from tests.support.fleet import free_port
from workers.models import Attempt
from workers.services.jobs import enqueue

# transaction=True: worker subprocesses must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def burst_worker_output(processes: Processes, **env: str) -> str:
    worker = processes.worker("--burst", "--name", "log-probe", env=worker_env(**env) if env else None)
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

    split = r"\[compute \d+ ms, db wait \d+ ms, storage wait \d+ ms\]"
    expected = [
        rf"INFO koala\.worker job {ok} \(noop, attempt 1, queue default\) succeeded in \d+ ms {split}$",
        rf"WARNING koala.worker job {failed} \(terminal, attempt 1, queue default\) failed in \d+ ms: terminal "
        rf"\(TerminalFailure:unauthorized\) {split}: account is not authorized$",
        rf"INFO koala\.worker job {retried} \(transient, attempt 1, queue default\) failed in \d+ ms \(Retryable\); "
        rf"retry in \d+\.\d s {split}: provider returned 503 \(attempt 1\)$",
    ]
    for pattern in expected:
        assert re.search(pattern, logs, re.MULTILINE), (pattern, logs)
    rq_lines = [line for line in logs.splitlines() if " rq." in line]
    assert rq_lines == [], rq_lines
    # One outcome line per attempt, and nothing else per job at INFO (its start is at DEBUG).
    for job_id in (ok, failed, retried):
        recorded = Attempt.objects.filter(job_id=job_id).exclude(outcome=None).count()
        lines = re.findall(rf" job {job_id} \(\S+, attempt \d+, queue default\) ", logs)
        assert len(lines) == recorded >= 1, (job_id, lines, logs)
    assert " started" not in logs


def test_debug_adds_the_routine_per_job_lines(processes: Processes) -> None:
    ok = enqueue(kind="noop", input={}).job_id
    logs = burst_worker_output(processes, LOG_LEVEL="DEBUG")
    assert re.search(rf"DEBUG koala\.worker job {ok} \(noop, attempt 1, queue default\) started$", logs, re.MULTILINE), logs
    assert re.search(rf"INFO koala\.worker job {ok} \(noop, attempt 1, queue default\) succeeded in ", logs), logs


CARD = "4111-1111-1111-1111"
BEARER = "sk_live_abcdefghijklmnop0123"
OUTCOME_FIELDS = {
    "ts",
    "level",
    "logger",
    "message",
    "event",
    "job_id",
    "attempt",
    "kind",
    "version",
    "queue",
    "outcome",
    "reason",
    "error",
    "total_seconds",
    "compute_seconds",
    "db_wait_seconds",
    "storage_wait_seconds",
}


def test_json_lines_carry_the_outcome_fields_and_stay_masked(processes: Processes) -> None:
    ok = enqueue(kind="noop", input={}).job_id
    failed = enqueue(kind="terminal", input={}).job_id
    # Its error message carries the card (a declared sensitive field) and a bearer token.
    leaky = enqueue(kind="boom", input={"card": CARD, "bearer": BEARER}).job_id
    logs = burst_worker_output(processes, KOALA_LOG_FORMAT="json")

    records = [json.loads(line) for line in logs.splitlines() if line.strip()]  # every line is one JSON object
    assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records), logs
    outcomes = [r for r in records if r.get("event") == "attempt_outcome"]
    by_job = {r["job_id"]: r for r in outcomes}
    assert sorted(by_job) == sorted([ok, failed, leaky]) and len(outcomes) == 3, outcomes
    for record in outcomes:
        assert set(record) == OUTCOME_FIELDS, record
        assert record["attempt"] == 1 and record["queue"] == "default"
        assert record["total_seconds"] >= record["compute_seconds"] >= 0
    assert (by_job[ok]["outcome"], by_job[ok]["reason"], by_job[ok]["level"]) == ("succeeded", "", "INFO")
    assert (by_job[failed]["outcome"], by_job[failed]["reason"], by_job[failed]["level"]) == ("failed", "terminal", "WARNING")
    assert by_job[leaky]["kind"] == "boom" and by_job[leaky]["reason"] == "fatal"
    assert "[redacted]" in by_job[leaky]["error"] and "[redacted]" in by_job[leaky]["message"]
    assert CARD not in logs and BEARER not in logs, logs


def test_the_web_process_logs_json_lines_too_masked(tmp_path: Path) -> None:
    """uvicorn's own loggers (its start, stop and access lines) join Koala's handler under json."""
    port = free_port()
    log = tmp_path / "web.log"
    with open(log, "wb") as out:
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "koala.asgi:application", "--port", str(port), "--lifespan", "off"],
            cwd=REPO,
            env=worker_env(KOALA_LOG_FORMAT="json"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_listening(web, port, timeout=60), log.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?token={BEARER}", timeout=10) as answer:
            answer.read()
    finally:
        web.terminate()
        web.wait(timeout=30)
    text = log.read_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    loggers = {r["logger"] for r in records}
    assert {"uvicorn.error", "uvicorn.access"} <= loggers, text
    assert BEARER not in text and "token=[redacted]" in text, text
    assert all("color_message" not in r for r in records)
