"""The classification a body's exceptions carry: which the runtime retries, which end the job,
and which a body's own ``except Exception`` can never swallow."""

from __future__ import annotations

import pytest

from workers.errors import (
    AttemptTimeout,
    Interrupted,
    OperationMismatch,
    Park,
    Paused,
    ReconcileLater,
    Rejection,
    Retryable,
    StaleAttempt,
    TerminalFailure,
)


@pytest.mark.parametrize(
    "signal",
    [Interrupted("timeout"), Park("budget", "no room"), ReconcileLater("open", delay_seconds=1.0), Paused("stop")],
    ids=lambda e: type(e).__name__,
)
def test_runtime_signals_pass_through_a_bodys_broad_except(signal: BaseException) -> None:
    def body() -> None:
        try:
            raise signal
        except Exception:  # what careless body code does
            pytest.fail(f"{type(signal).__name__} was swallowed by `except Exception`")

    with pytest.raises(type(signal)):
        body()


def test_a_timeout_is_retried_like_any_transient_error() -> None:
    assert issubclass(AttemptTimeout, Retryable)
    assert Retryable("slow").retry_after is None
    assert Retryable("slow", retry_after=2.5).retry_after == 2.5


def test_terminal_failures_carry_a_code() -> None:
    assert TerminalFailure("no").code == "terminal"
    assert TerminalFailure("no", code="unauthorized").code == "unauthorized"
    assert TerminalFailure("no", code="").code == "terminal"  # an empty code keeps the default
    assert isinstance(OperationMismatch("other params"), TerminalFailure)
    assert OperationMismatch("other params").code == "operation_mismatch"


def test_the_rejections_are_a_closed_set_of_stable_names() -> None:
    # Stored in attempt records and sent over the API: renaming one breaks readers.
    assert [r.value for r in Rejection] == ["lease_expired", "lease_superseded", "job_cancelled", "already_recorded"]
    stale = StaleAttempt(Rejection.JOB_CANCELLED)
    assert (stale.rejection, str(stale)) == (Rejection.JOB_CANCELLED, "job_cancelled")


def test_park_and_reconcile_later_describe_why_and_when() -> None:
    parked = Park("needs_attention", "charge outcome unknown", {"operation": 3})
    assert (parked.reason, parked.detail, parked.parked_on, str(parked)) == (
        "needs_attention",
        "charge outcome unknown",
        {"operation": 3},
        "charge outcome unknown",
    )
    assert Park("budget", "full").parked_on == {}
    later = ReconcileLater("provider still processing", delay_seconds=4.0)
    assert (later.reason, later.delay_seconds, later.parked_on) == ("reconcile_later", 4.0, {})
