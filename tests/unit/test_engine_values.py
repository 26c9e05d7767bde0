"""Small rules of the engine's records: operation keys, terminal states, when a silent worker is
gone, the session bounds, and how a stored error class maps back to an exception for Django tasks."""

from __future__ import annotations

from typing import Any

import pytest

from workers.dbsession import session_bounds
from workers.models import TERMINAL_STATES, Job, JobState, Operation, OperationState, WorkerProcess, operation_key_base
from workers.tasks_backend import _exception_path


def test_operation_keys_prefer_the_carried_base_then_the_jobs_key() -> None:
    assert operation_key_base(job_id=5, idempotency_key=None) == "koala-job-5"
    assert operation_key_base(job_id=5, idempotency_key="order-77") == "order-77"
    assert operation_key_base(job_id=9, idempotency_key="order-77-retry", carried="order-77") == "order-77"
    assert operation_key_base(job_id=9, idempotency_key="", carried="") == "koala-job-9"


@pytest.mark.parametrize("state", JobState.values)
def test_exactly_succeeded_failed_and_cancelled_are_terminal(state: str) -> None:
    assert Job(state=state).is_terminal is (state in {"succeeded", "failed", "cancelled"})
    assert set(TERMINAL_STATES) == {"succeeded", "failed", "cancelled"}


@pytest.mark.parametrize("state", OperationState.values)
def test_an_operation_is_done_once_succeeded_or_reconciled(state: str) -> None:
    assert Operation(state=state).is_done is (state in {"succeeded", "reconciled"})


@pytest.mark.parametrize(("lease", "heartbeat", "silent"), [(30, 10, 30.0), (3, 0.5, 3.0), (5, 4, 12.0)])
def test_a_worker_is_gone_after_a_lease_and_never_before_three_missed_heartbeats(
    settings: Any, lease: float, heartbeat: float, silent: float
) -> None:
    settings.KOALA_LEASE_SECONDS, settings.KOALA_HEARTBEAT_SECONDS = lease, heartbeat
    assert WorkerProcess.silent_after_seconds() == silent


def test_session_bounds_are_whole_milliseconds_and_never_zero(settings: Any) -> None:
    settings.KOALA_DB_STATEMENT_TIMEOUT_SECONDS = 1.5
    settings.KOALA_DB_LOCK_TIMEOUT_SECONDS = 0.0001  # zero would mean "no timeout" to PostgreSQL
    settings.KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = 2
    assert session_bounds() == {
        "statement_timeout": "1500ms",
        "lock_timeout": "1ms",
        "idle_in_transaction_session_timeout": "2000ms",
    }


@pytest.mark.parametrize(
    ("stored", "path"),
    [
        ("ValueError", "builtins.ValueError"),
        ("KeyError", "builtins.KeyError"),
        ("Retryable", "workers.errors.Retryable"),
        ("TerminalFailure:unauthorized", "workers.errors.TerminalFailure"),
        ("AttemptTimeout", "workers.errors.AttemptTimeout"),
        ("CardDeclined", "builtins.Exception"),  # a body's own class: not importable from a name alone
        ("print", "builtins.Exception"),  # a builtin that is not a class
    ],
)
def test_a_stored_error_class_maps_to_an_importable_exception(stored: str, path: str) -> None:
    assert _exception_path(stored) == path
