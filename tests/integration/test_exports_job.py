"""The export job in this process against real PostgreSQL, Redis and a real folder: content,
limits, classification of errors, the timing split and idempotent re-runs."""

from __future__ import annotations

import contextlib
import time
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from exports.models import Export, ExportState
from exports.signals import export_batch
from tests.inprocess import run_export
from tests.support.exports import (
    People,
    database_backends,
    direct_copy,
    load_events,
    published,
    request,
    row_count,
    sha256,
    temp_files,
)
from workers.models import Attempt, Job, Operation

# transaction=True: the export's job runs through the real runtime (tests/inprocess.py), and its
# stream reads the events on a connection of its own.
pytestmark = pytest.mark.django_db(transaction=True)


# Test 1 ------------------------------------------------------------------------------------------
def test_200k_row_export_equals_a_direct_copy_of_the_same_query(people: People, export_root: Path, redis_clean: None) -> None:
    # 400k events over two accounts: acme's 200k are exported, globex's must not leak in.
    load_events(people.acme, rows=200_000, seed=1)
    load_events(people.globex, rows=200_000, seed=2)
    export = request(people)
    assert Job.objects.get(pk=export.job_id).input == {"export_id": export.pk}, "the message carries only the id"

    done = run_export(export.pk)

    source = direct_copy(people.acme)
    assert row_count(source) == 200_000
    assert done.state == ExportState.SUCCEEDED, (done.failure_code, done.error_message)
    assert done.row_count == 200_000
    assert done.bytes == len(source)
    assert done.checksum == sha256(source)
    files = published(export_root)
    assert files == [export_root / done.output_key] and done.output_key == f"exports/{done.pk}/export-{done.pk}.csv"
    assert sha256(files[0].read_bytes()) == sha256(source)
    assert temp_files(export_root) == []
    # The publish went through the ledger, once, keyed by the export id, with the checksum.
    op = Operation.objects.get(job_id=done.job_id)
    assert (op.kind, op.key, op.state) == ("publish", f"export-{done.pk}:publish", "succeeded")
    assert op.params["sha256"] == done.checksum and op.params["bytes"] == done.bytes
    # The job's result is the same logical result.
    assert Job.objects.get(pk=done.job_id).result == {
        "key": done.output_key,
        "sha256": done.checksum,
        "bytes": done.bytes,
        "rows": 200_000,
    }


def test_timing_split_is_recorded_on_the_attempt_and_the_export(people: People, export_root: Path, redis_clean: None) -> None:
    load_events(people.acme, rows=50_000)
    done = run_export(request(people).pk)
    assert done.state == ExportState.SUCCEEDED
    attempt = Attempt.objects.get(job_id=done.job_id)
    for record in (attempt, done):
        assert record.compute_seconds is not None and record.compute_seconds > 0
        assert record.db_wait_seconds is not None and record.db_wait_seconds > 0
        assert record.storage_wait_seconds is not None and record.storage_wait_seconds > 0
    # The export's split is that attempt's body, measured inside it: never more than the attempt.
    assert done.db_wait_seconds <= attempt.db_wait_seconds + 1e-6
    assert done.storage_wait_seconds <= attempt.storage_wait_seconds + 1e-6


def test_empty_range_exports_only_the_header(people: People, export_root: Path, redis_clean: None) -> None:
    load_events(people.globex, rows=1_000)
    done = run_export(request(people).pk)
    source = direct_copy(people.acme)
    assert (done.state, done.row_count, done.checksum) == (ExportState.SUCCEEDED, 0, sha256(source))
    assert (
        (export_root / done.output_key).read_bytes()
        == source
        == b"id,occurred_at,event_type,user_ref,amount_minor,currency,country,detail\n"
    )


def test_a_date_range_exports_exactly_those_days(people: People, export_root: Path, redis_clean: None) -> None:
    load_events(people.acme, rows=30_000)
    export = request(people, date_from=date(2026, 3, 1), date_to=date(2026, 3, 31))
    done = run_export(export.pk)
    source = direct_copy(people.acme, date(2026, 3, 1), date(2026, 3, 31))
    assert 0 < row_count(source) < 30_000
    assert (done.row_count, done.checksum) == (row_count(source), sha256(source))
    lines = (export_root / done.output_key).read_text().splitlines()[1:]
    assert lines[0].split(",")[1].startswith("2026-03-01") and lines[-1].split(",")[1].startswith("2026-03-31")


def test_a_rerun_of_a_completed_export_job_returns_the_same_result(people: People, export_root: Path, redis_clean: None) -> None:
    """Completion of the export recorded, completion of the job lost: the body answers from the row."""
    load_events(people.acme, rows=5_000)
    done = run_export(request(people).pk)
    job = Job.objects.get(pk=done.job_id)
    # Put the job back as if the worker had died after the export row was completed.
    Job.objects.filter(pk=job.pk).update(state="queued", result=None, finished_at=None)
    again = run_export(done.pk)
    assert Job.objects.get(pk=job.pk).result == job.result
    assert (again.checksum, again.finished_at) == (done.checksum, done.finished_at), "the export completed once"
    assert len(published(export_root)) == 1 and Operation.objects.filter(job_id=job.pk).count() == 1


# Test 6 ------------------------------------------------------------------------------------------
def test_row_limit_stops_the_export_with_a_terminal_reason(people: People, export_root: Path, redis_clean: None) -> None:
    load_events(people.acme, rows=12_000)
    done = run_export(request(people, max_rows=10_000).pk)
    job = Job.objects.get(pk=done.job_id)
    assert (done.state, done.failure_code) == (ExportState.FAILED, "row_limit_exceeded")
    assert "10000 rows" in done.error_message
    assert (job.state, job.failure_reason, job.error_class, job.attempts) == (
        "failed",
        "terminal",
        "TerminalFailure:row_limit_exceeded",
        1,
    ), "a terminal reason is not retried"
    assert published(export_root) == [] and temp_files(export_root) == []


def test_exactly_max_rows_is_within_the_limit(people: People, export_root: Path, redis_clean: None) -> None:
    load_events(people.acme, rows=3_000)
    done = run_export(request(people, max_rows=3_000).pk)
    assert (done.state, done.row_count) == (ExportState.SUCCEEDED, 3_000)


def test_byte_limit_stops_the_export_with_a_terminal_reason(people: People, export_root: Path, redis_clean: None) -> None:
    load_events(people.acme, rows=20_000)
    done = run_export(request(people, max_bytes=100_000).pk)
    assert (done.state, done.failure_code) == (ExportState.FAILED, "byte_limit_exceeded")
    assert Job.objects.get(pk=done.job_id).attempts == 1
    assert published(export_root) == [] and temp_files(export_root) == []


@pytest.mark.alone  # counts the batches done in 0.5 s of wall time: other tests' CPU would make them fewer
def test_time_limit_stops_the_export_between_batches(people: People, export_root: Path, redis_clean: None, settings: Any) -> None:
    settings.KOALA_EXPORT_BATCH_ROWS = 1_000
    load_events(people.acme, rows=20_000)
    batches: list[float] = []

    def slow(sender: object, **kwargs: Any) -> None:  # a slow storage, as seen by the body
        batches.append(time.monotonic())
        time.sleep(0.1)  # wall time on purpose: the time limit under test is wall time

    export_batch.connect(slow, dispatch_uid="slow")
    try:
        done = run_export(request(people, time_limit_seconds=0.5).pk)
    finally:
        export_batch.disconnect(dispatch_uid="slow")
    job = Job.objects.get(pk=done.job_id)
    assert (done.state, done.failure_code) == (ExportState.FAILED, "time_limit_exceeded")
    assert "time limit of 0.5s" in done.error_message
    assert (job.failure_reason, job.error_class, job.attempts) == ("terminal", "TerminalFailure:time_limit_exceeded", 1)
    assert 4 <= len(batches) <= 7, f"stopped at the first batch boundary past 0.5 s, not at the end ({len(batches)} of 20)"
    assert published(export_root) == [] and temp_files(export_root) == []


# Terminal classification -----------------------------------------------------------------------
def test_access_revoked_before_the_run_fails_terminally_as_unauthorized(
    people: People, export_root: Path, redis_clean: None
) -> None:
    load_events(people.acme, rows=1_000)
    export = request(people)
    people.acme.members.remove(people.alice)
    done = run_export(export.pk)
    job = Job.objects.get(pk=done.job_id)
    assert (done.state, done.failure_code) == (ExportState.FAILED, "unauthorized")
    assert (job.failure_reason, job.error_class, job.attempts) == ("terminal", "TerminalFailure:unauthorized", 1)
    assert published(export_root) == [] and temp_files(export_root) == []


def test_a_connection_nobody_took_is_closed_by_the_connector() -> None:
    from exports.streaming import Connector

    # What an attempt that ends before its stream (a terminal check, a lost lease) relies on.
    name = f"koala-export-connector-{time.monotonic_ns()}"
    connector = Connector(session={}, statement_timeout_seconds=None, application_name=name)
    deadline = time.monotonic() + 10
    while not database_backends(name) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert database_backends(name), "the connector opened its session"
    connector.close()
    deadline = time.monotonic() + 5
    while database_backends(name) and time.monotonic() < deadline:  # a closed backend leaves shortly after
        time.sleep(0.02)
    assert database_backends(name) == [], "closed while the connector is still referenced"


def test_a_connection_the_connector_could_not_open_is_raised_where_it_is_taken() -> None:
    import psycopg

    from exports.streaming import Connector, CopyReader

    def waiting(what: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    # The server refuses the session at start-up (an invalid setting): the opening thread keeps
    # the error, and the reader raises it as it would have raised its own connect's.
    connector = Connector(
        session={"DateStyle": "no such style"}, statement_timeout_seconds=None, application_name="koala-export-test"
    )
    with pytest.raises(psycopg.OperationalError, match="DateStyle"):
        with CopyReader(statement="unused", batch_rows=10, waiting=waiting, connector=connector):
            pass
    connector.close()  # nothing to close: a no-op after the error


def test_a_format_this_worker_does_not_support_fails_terminally(people: People, export_root: Path, redis_clean: None) -> None:
    export = request(people)
    # A row written by a newer release that knows a format this worker does not.
    Export.objects.filter(pk=export.pk).update(format="xlsx")
    done = run_export(export.pk)
    assert (done.state, done.failure_code) == (ExportState.FAILED, "unsupported_format")
    assert Job.objects.get(pk=done.job_id).attempts == 1


def test_a_scope_beyond_lowered_caps_fails_terminally(
    people: People, export_root: Path, redis_clean: None, settings: Any
) -> None:
    export = request(people)  # a whole year, allowed when requested
    settings.KOALA_EXPORT_MAX_DAYS = 31  # lowered before it ran
    done = run_export(export.pk)
    assert (done.state, done.failure_code) == (ExportState.FAILED, "scope_beyond_limits")
    assert "365 days > 31" in done.error_message
    assert Job.objects.get(pk=done.job_id).attempts == 1


# Transient classification ------------------------------------------------------------------------
def test_a_dropped_database_connection_mid_stream_is_retried(
    people: People, export_root: Path, redis_clean: None, settings: Any
) -> None:
    settings.KOALA_EXPORT_BATCH_ROWS = 1_000
    load_events(people.acme, rows=20_000)
    export = request(people)
    killed: list[int] = []

    def drop_connection(sender: object, *, attempt: int, batch: int, **kwargs: Any) -> None:
        if attempt == 1 and batch == 3:
            with connection.cursor() as cursor:  # the body's own Django connection: same process
                for pid in database_backends(f"koala-export-{export.pk}"):
                    # With a timeout, PostgreSQL returns once the backend has really exited.
                    cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
                    assert cursor.fetchone()[0], f"backend {pid} did not exit"
                    killed.append(pid)

    export_batch.connect(drop_connection, dispatch_uid="drop")
    try:
        done = run_export(export.pk)
    finally:
        export_batch.disconnect(dispatch_uid="drop")
    assert killed, "the streaming connection was found and terminated"
    attempts = list(Attempt.objects.filter(job_id=done.job_id).order_by("number"))
    assert [a.outcome for a in attempts] == ["retry", "succeeded"]
    assert attempts[0].error_class == "Retryable" and "database" in attempts[0].error_message
    source = direct_copy(people.acme)
    assert (done.state, done.checksum, done.attempts) == (ExportState.SUCCEEDED, sha256(source), 2)
    assert len(published(export_root)) == 1 and temp_files(export_root) == []


def test_the_beat_brings_an_engine_decided_outcome_to_the_export(people: People, export_root: Path, redis_clean: None) -> None:
    from django.core.management import call_command

    from workers.services.jobs import cancel_job

    export = request(people)
    cancel_job(job_id=export.job_id, actor="ops", reason="not needed")  # the engine's own cancel, not the export's
    assert Export.objects.get(pk=export.pk).state == "queued"
    call_command("koala_beat", "--once")
    assert Export.objects.get(pk=export.pk).state == "cancelled"
