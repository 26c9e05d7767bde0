"""The outcome decision as a table: every ending x delivery mode x attempts left -> one Decision.

``outcomes.decide`` is pure, so this runs without a database (tests/unit never gets one). Each
row states the ending and, literally, the lease transition the engine must record for it. The
backoff's jitter comes from ``rng``: these tests pass one that always draws the top of the range,
so a retry's delay is the backoff ceiling min(cap, base * 2**(n-1)), n = attempts used.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError

from workers import outcomes
from workers.bounds import Limit, Limits
from workers.errors import Rejection, Retryable, TerminalFailure
from workers.kinds import JobKind
from workers.models import Delivery, FailureReason, Outcome, ParkReason
from workers.outcomes import (
    Classification,
    Complete,
    Cut,
    Discard,
    Fail,
    GivenBack,
    Park,
    Parked,
    Raised,
    Reconciling,
    Release,
    RetryLater,
    Returned,
    Stale,
    Unservable,
    decide,
)
from workers.services.leases import Lease

ALO, AMO = Delivery.AT_LEAST_ONCE, Delivery.AT_MOST_ONCE
# attempts left -> (attempts used, this one included; max_attempts). An at_most_once kind has
# max_attempts=1, but its lease can carry more: an operator's requeue grants the attempt it asks for.
LEFT = {0: (3, 3), 1: (2, 3), "many": (1, 5)}
COMBOS = [(delivery, left) for delivery in (ALO, AMO) for left in LEFT]


class Ceiling(random.Random):
    """Full jitter's upper bound, always: makes the backoff a number a row can state."""

    def uniform(self, a: float, b: float) -> float:
        return b


def body(ctx: Any, data: dict[str, Any]) -> None:
    return None


KIND = JobKind(name="t.decide", version=2, body=body, backoff_base=1.0, backoff_cap=300.0, sensitive_fields=frozenset({"pin"}))


def lease(*, delivery: str = ALO, left: int | str = "many", **changes: Any) -> Lease:
    attempts, max_attempts = LEFT[left]
    base = Lease(
        job_id=41,
        attempt_id=7,
        kind="t.decide",
        version=2,
        queue="default",
        input={"pin": "8d1f-secret-pin", "n": 1},
        run_state={},
        progress={},
        lease_token=3,
        attempts=attempts,
        max_attempts=max_attempts,
        delivery=delivery,
        timeout_seconds=30.0,
        deadline_at=None,
        correlation_id="c",
        trace_id="t",
        idempotency_key=None,
        created_by="",
        operation_key_base="",
    )
    return replace(base, **changes)


def retry_or_exhausted(error_class: str, message: str) -> dict[Any, outcomes.Decision]:
    """A retryable ending: retried while an attempt is left (delay = the backoff ceiling), else attempts_exhausted."""
    exhausted = Fail(reason=FailureReason.ATTEMPTS_EXHAUSTED, error_class=error_class, message=message)
    table: dict[Any, outcomes.Decision] = {}
    for delivery in (ALO, AMO):
        table[(delivery, 0)] = exhausted
        table[(delivery, 1)] = RetryLater(delay_seconds=2.0, error_class=error_class, message=message)  # 2 used: ceiling 2
        table[(delivery, "many")] = RetryLater(delay_seconds=1.0, error_class=error_class, message=message)  # 1 used: 1
    return table


def by_delivery(at_least_once: outcomes.Decision, at_most_once: outcomes.Decision) -> dict[Any, outcomes.Decision]:
    return {(delivery, left): at_least_once if delivery == ALO else at_most_once for delivery, left in COMBOS}


def over_limit(error_class: str, reason: FailureReason, message: str) -> dict[Any, outcomes.Decision]:
    """A ceiling breach: at_least_once retries while an attempt is left, then fails with the
    ceiling's own reason; at_most_once fails with it at once."""
    failed = Fail(reason=reason, error_class=error_class, message=message)
    table: dict[Any, outcomes.Decision] = {(AMO, left): failed for left in (0, 1, "many")}
    table[(ALO, 0)] = failed
    table[(ALO, 1)] = RetryLater(delay_seconds=2.0, error_class=error_class, message=message)
    table[(ALO, "many")] = RetryLater(delay_seconds=1.0, error_class=error_class, message=message)
    return table


MEMORY_LIMIT = "the attempt went past its memory ceiling of 64 MiB (RLIMIT_DATA above the work horse's start)"
CPU_LIMIT = "the attempt went past its CPU-time ceiling of 3 s"
RELEASED_AT_SHUTDOWN = Release(outcome=Outcome.INTERRUPTED, message="released at worker shutdown deadline")
ORPHANED = Fail(
    reason=FailureReason.ORPHANED,
    error_class="Interrupted",
    message="interrupted at the worker's shutdown deadline; at_most_once does not run a body twice",
)
TIMEOUT = "attempt exceeded its time limit of 30s"
LOST = "database connection lost during the attempt (OperationalError)"

# (case id, ending, expected): one Decision for every combination, or one per (delivery, left).
TABLE: list[tuple[str, outcomes.Ending, outcomes.Decision | dict[Any, outcomes.Decision]]] = [
    ("returned", Returned(value={"sent": 3}, state_delta={"cursor": 9}), Complete(result={"sent": 3}, state_delta={"cursor": 9})),
    ("returned-nothing", Returned(value=None), Complete(result=None, state_delta={})),
    (
        "parked-for-review",
        Parked(reason=ParkReason.WAITING_REVIEW, detail="critical charge waits for review 5", parked_on={"review_id": 5}),
        Park(reason=ParkReason.WAITING_REVIEW, detail="critical charge waits for review 5", parked_on={"review_id": 5}),
    ),
    (
        "parked-budget",
        Parked(reason=ParkReason.BUDGET, detail="budget 'daily' for 2026-01-01: request limit 3 reached"),
        Park(reason=ParkReason.BUDGET, detail="budget 'daily' for 2026-01-01: request limit 3 reached", parked_on={}),
    ),
    (
        "reconciling",
        Reconciling(detail="charge 'charge' (key k): outcome open; looking again in 2.5s", delay_seconds=2.5),
        Release(
            outcome=Outcome.INTERRUPTED, message="charge 'charge' (key k): outcome open; looking again in 2.5s", delay_seconds=2.5
        ),
    ),
    (
        "reconciling-redacts-the-input's-secrets",
        Reconciling(detail="lookup of 8d1f-secret-pin failed", delay_seconds=1.0),
        Release(outcome=Outcome.INTERRUPTED, message="lookup of [redacted] failed", delay_seconds=1.0),
    ),
    # A checkpoint is a safe point, and a body that never started left nothing half-done: even
    # at_most_once is given back.
    (
        "stopped-for-pause",
        GivenBack(why="released by a stop pause"),
        Release(outcome=Outcome.INTERRUPTED, message="released by a stop pause"),
    ),
    (
        "never-started",
        GivenBack(why="released: the acquire request it was claimed for had ended"),
        Release(outcome=Outcome.INTERRUPTED, message="released: the acquire request it was claimed for had ended"),
    ),
    ("cut-at-shutdown", outcomes.Interrupted(why=Cut.SHUTDOWN), by_delivery(RELEASED_AT_SHUTDOWN, ORPHANED)),
    ("cut-by-stop-pause", outcomes.Interrupted(why=Cut.PAUSED), by_delivery(RELEASED_AT_SHUTDOWN, ORPHANED)),
    (
        "cut-at-deadline",
        outcomes.Interrupted(why=Cut.DEADLINE),
        Fail(
            reason=FailureReason.DEADLINE_EXCEEDED,
            error_class="TerminalFailure",
            message="the job's overall deadline passed during the attempt",
        ),
    ),
    ("cut-at-time-limit", outcomes.Interrupted(why=Cut.TIMEOUT), retry_or_exhausted("AttemptTimeout", TIMEOUT)),
    ("cut-for-unknown-reason", outcomes.Interrupted(why=Cut.named("alarm")), retry_or_exhausted("AttemptTimeout", TIMEOUT)),
    ("cut-while-stale", outcomes.Interrupted(why=Cut.STALE), Discard(rejection=None)),
    ("stale-superseded", Stale(rejection=Rejection.LEASE_SUPERSEDED), Discard(rejection=Rejection.LEASE_SUPERSEDED)),
    ("stale-cancelled", Stale(rejection=Rejection.JOB_CANCELLED), Discard(rejection=Rejection.JOB_CANCELLED)),
    ("stale-expired", Stale(rejection=Rejection.LEASE_EXPIRED), Discard(rejection=Rejection.LEASE_EXPIRED)),
    ("raised-retryable", Raised.of(Retryable("smtp said 451")), retry_or_exhausted("Retryable", "smtp said 451")),
    (
        "raised-retryable-with-retry-after",
        Raised.of(Retryable("429 slow down", retry_after=7.0)),
        {
            **{
                (d, 0): Fail(reason=FailureReason.ATTEMPTS_EXHAUSTED, error_class="Retryable", message="429 slow down")
                for d in (ALO, AMO)
            },
            **{
                (d, left): RetryLater(delay_seconds=7.0, error_class="Retryable", message="429 slow down")
                for d in (ALO, AMO)
                for left in (1, "many")
            },
        },
    ),
    (
        "raised-retryable-redacts-the-input's-secrets",
        Raised.of(Retryable("provider echoed 8d1f-secret-pin and Bearer abcdefghijkl")),
        retry_or_exhausted("Retryable", "provider echoed [redacted] and Bearer [redacted]"),
    ),
    ("raised-database-lost", Raised.of(OperationalError("server closed the connection")), retry_or_exhausted("Retryable", LOST)),
    (
        "raised-interface-lost",
        Raised.of(InterfaceError("connection already closed")),
        retry_or_exhausted("Retryable", "database connection lost during the attempt (InterfaceError)"),
    ),
    (
        "raised-terminal",
        Raised.of(TerminalFailure("unsupported format")),
        Fail(reason=FailureReason.TERMINAL, error_class="TerminalFailure", message="unsupported format"),
    ),
    (
        "raised-terminal-with-code",
        Raised.of(TerminalFailure("account closed", code="unauthorized")),
        Fail(reason=FailureReason.TERMINAL, error_class="TerminalFailure:unauthorized", message="account closed"),
    ),
    # An HTTP worker's fail call (api.protocol.fail): the worker names the class, the server decides.
    (
        "reported-retryable",
        outcomes.Reported(classification=Classification.RETRYABLE, error_class="ProviderTimeout", message="smtp said 451"),
        retry_or_exhausted("ProviderTimeout", "smtp said 451"),
    ),
    (
        "reported-retryable-with-retry-after-redacted",
        outcomes.Reported(
            classification=Classification.RETRYABLE, error_class="Slow", message="echoed 8d1f-secret-pin", retry_after=7.0
        ),
        {
            **{
                (d, 0): Fail(reason=FailureReason.ATTEMPTS_EXHAUSTED, error_class="Slow", message="echoed [redacted]")
                for d in (ALO, AMO)
            },
            **{
                (d, left): RetryLater(delay_seconds=7.0, error_class="Slow", message="echoed [redacted]")
                for d in (ALO, AMO)
                for left in (1, "many")
            },
        },
    ),
    (
        "reported-step-failure",
        outcomes.Reported(classification=Classification.TERMINAL, error_class="InvalidAccount", message="closed"),
        Fail(reason=FailureReason.TERMINAL, error_class="InvalidAccount", message="closed"),
    ),
    (
        "reported-fatal",
        outcomes.Reported(classification=Classification.FATAL, error_class="KeyError", message="'total'"),
        Fail(reason=FailureReason.FATAL, error_class="KeyError", message="'total'"),
    ),
    (
        "raised-anything-else",
        Raised.of(KeyError("total")),
        Fail(reason=FailureReason.FATAL, error_class="KeyError", message="'total'"),
    ),
    # A per-attempt ceiling (workers.bounds): retried while attempts are left (at_least_once), and
    # the last failure keeps the ceiling's name; at_most_once was cut off mid-body and fails at once.
    (
        "over-the-memory-ceiling",
        outcomes.OverLimit(limit=Limit.MEMORY, limits=Limits(memory_mb=64)),
        over_limit("MemoryLimitExceeded", FailureReason.MEMORY_LIMIT, MEMORY_LIMIT),
    ),
    (
        "over-the-cpu-ceiling",
        outcomes.OverLimit(limit=Limit.CPU, limits=Limits(cpu_seconds=3)),
        over_limit("CpuLimitExceeded", FailureReason.CPU_LIMIT, CPU_LIMIT),
    ),
    (
        "horse-killed-at-the-cpu-ceiling",
        outcomes.OverLimit(limit=Limit.CPU, limits=Limits(cpu_seconds=3), killed=True),
        over_limit("CpuLimitExceeded", FailureReason.CPU_LIMIT, CPU_LIMIT + "; the work horse was killed"),
    ),
]


def expected_for(expected: outcomes.Decision | dict[Any, outcomes.Decision], delivery: str, left: int | str) -> outcomes.Decision:
    return expected[(delivery, left)] if isinstance(expected, dict) else expected


@pytest.mark.parametrize(("delivery", "left"), COMBOS, ids=[f"{d}-left-{n}" for d, n in COMBOS])
@pytest.mark.parametrize(("ending", "expected"), [(e, x) for _, e, x in TABLE], ids=[case for case, _, _ in TABLE])
def test_each_ending_decides_one_transition(
    ending: outcomes.Ending, expected: outcomes.Decision | dict[Any, outcomes.Decision], delivery: str, left: int | str
) -> None:
    assert decide(ending, lease(delivery=delivery, left=left), KIND, rng=Ceiling()) == expected_for(expected, delivery, left)


def test_the_table_covers_every_ending_and_every_classification() -> None:
    endings = {type(ending) for _, ending, _ in TABLE} | {Unservable}
    assert endings == set(outcomes.Ending.__args__)  # type: ignore[attr-defined]
    cuts = {ending.why for _, ending, _ in TABLE if isinstance(ending, outcomes.Interrupted)}
    assert cuts == set(Cut)
    classes = {ending.classification for _, ending, _ in TABLE if isinstance(ending, Raised)}
    assert classes == set(Classification)
    for combo in COMBOS:
        for case, _, expected in TABLE:
            assert not isinstance(expected, dict) or combo in expected, (case, combo)


@pytest.mark.parametrize(("earlier", "delay"), [(0, 0.5), (1, 1.0), (3, 4.0), (6, 30.0), (40, 30.0)])
def test_an_unservable_job_is_released_with_a_growing_backoff(earlier: int, delay: float) -> None:
    """No body ran, so neither the delivery mode nor the attempts left change anything."""
    expected = Release(outcome=Outcome.UNSERVABLE, message="worker host.12 does not serve t.decide@2", delay_seconds=delay)
    for delivery, left in COMBOS:
        assert decide(Unservable(worker="host.12", earlier=earlier), lease(delivery=delivery, left=left), None) == expected


@pytest.mark.parametrize("rejected", list(Rejection))
@pytest.mark.parametrize("ending", [e for _, e, _ in TABLE], ids=[case for case, _, _ in TABLE])
def test_after_a_rejection_only_a_returned_body_still_reports(ending: outcomes.Ending, rejected: Rejection) -> None:
    """The engine already told this attempt it is stale. A body that returned still reports (its
    fenced write then gets the rejection back by name, or already_recorded); any other ending is
    discarded, whatever the delivery mode and attempts left: nothing a stale attempt says may count."""
    for delivery, left in COMBOS:
        decision = decide(ending, lease(delivery=delivery, left=left), KIND, rejected=rejected, rng=Ceiling())
        if isinstance(ending, Returned):
            assert decision == Complete(result=ending.value, state_delta=ending.state_delta)
        else:
            assert decision == Discard(rejection=rejected)


def test_the_backoff_is_the_kinds_full_jitter() -> None:
    """With real randomness the delay is uniform under the kind's ceiling (seeded: reproducible)."""
    delays = [
        decide(Raised.of(Retryable("x")), lease(attempts=4, max_attempts=9), KIND, rng=random.Random(seed)) for seed in range(200)
    ]
    assert all(isinstance(d, RetryLater) for d in delays)
    values = [d.delay_seconds for d in delays if isinstance(d, RetryLater)]
    assert all(0.0 <= v <= 8.0 for v in values) and max(values) > 6.0 and len(set(values)) > 150


def test_the_decision_does_not_share_the_bodys_state_delta() -> None:
    delta = {"cursor": 1}
    decision = decide(Returned(value=1, state_delta=delta), lease(), KIND)
    delta["cursor"] = 2
    assert decision == Complete(result=1, state_delta={"cursor": 1})


def test_a_body_ending_needs_the_kind_that_ran() -> None:
    with pytest.raises(ValueError, match="needs the kind"):
        decide(Returned(value=1), lease(), None)
