"""How an attempt ends, and what the engine records for it: endings in, one decision out.

The runtime (an RQ worker's ``WorkerRuntime``, or the HTTP protocol for a worker elsewhere) turns
whatever the body did into an **ending** (it returned, parked, was cut off, found itself stale,
raised, or the worker reported how it failed), then asks ``decide(ending, lease, kind)`` for the
**decision**: exactly one lease transition and its fields, or nothing at all. ``decide`` is pure
(no database, no clock; the backoff's randomness comes in as ``rng``), so the whole table of
endings, delivery modes and attempts left is tested without a database
(tests/unit/test_decide.py). ``workers.transitions.end_attempt`` is the one writer: it records a
decision with one fenced statement, for both kinds of worker.

    ending                                   decision
    Returned(value, state_delta)             Complete
    Parked(reason, …)                        Park                  (no attempt used)
    Reconciling(detail, delay)               Release interrupted   (no attempt used)
    GivenBack(why)                           Release interrupted   (never started, or stopped at a
                                                                    checkpoint: any delivery)
    Interrupted(shutdown | paused)           Release interrupted   (at_least_once)
                                             Fail orphaned         (at_most_once: never twice)
    Interrupted(deadline)                    Fail deadline_exceeded
    Interrupted(timeout)                     RetryLater / Fail attempts_exhausted
    Raised(Retryable | connection lost)      RetryLater / Fail attempts_exhausted
    Raised(TerminalFailure)                  Fail terminal
    Raised(anything else)                    Fail fatal
    Reported(retryable)                      RetryLater / Fail attempts_exhausted   (an HTTP worker's fail call)
    Reported(terminal)                       Fail terminal
    Reported(fatal)                          Fail fatal
    Unservable(worker, earlier)              Release unservable    (backoff 0.5 s doubling, ≤ 30 s)
    OverLimit(memory | cpu, limits)          RetryLater            (at_least_once with attempts left;
                                                                    error MemoryLimitExceeded / CpuLimitExceeded)
                                             Fail memory_limit / cpu_limit   (attempts spent, or at_most_once:
                                                                    cut off mid-body, never run twice)
    Stale / Interrupted(stale) / any ending
      but Returned after a rejection         Discard               (nothing this attempt says counts)

A ceiling breach (``OverLimit``: the body raised MemoryError or was told SIGXCPU under its
ceiling, or its work horse died of one and the parent saw it; workers.bounds) is retryable by
default: a bigger input or a busy host may fit next time, and the attempt budget bounds it. Its
last failure keeps its name (``memory_limit`` / ``cpu_limit``, not ``attempts_exhausted``), and
the circuit breaker counts it as a crash.

One retry rule serves every failure (``_retry_or_fail``): a retryable failure retries while the
job has attempts left, after its own retry-after or the kind's backoff, and ends
``attempts_exhausted`` after; anything else fails with its reason at once. One naming rule serves
every error (``error_class_of``): an RQ body's ``TerminalFailure(code=…)`` and the same failure
reported by an HTTP worker are stored under the same name.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError

from koala import redaction, storable
from koala.redaction import Redactor
from workers.bounds import Limit, Limits, describe
from workers.errors import AttemptTimeout, Rejection, Retryable, StepFailure, TerminalFailure
from workers.kinds import JobKind
from workers.models import Delivery, FailureReason, Outcome

if TYPE_CHECKING:
    from workers.services.leases import Lease

UNSERVABLE_MAX_DELAY = 30.0  # seconds; a job nobody here serves is retried at most this rarely

# -- endings: what the body did ------------------------------------------------------------------


class Cut(enum.StrEnum):
    """Why the runtime interrupted a body mid-way (the SIGALRM reasons, workers.runtime)."""

    SHUTDOWN = "shutdown"  # the worker's shutdown deadline passed
    PAUSED = "paused"  # a stop pause covers the job and the body did not reach a checkpoint in time
    DEADLINE = "deadline"  # the job's overall deadline passed
    TIMEOUT = "timeout"  # the attempt's time limit (the kind's timeout_seconds) passed
    STALE = "stale"  # the lease was lost and the body ignored ctx.cancelled for a heartbeat

    @classmethod
    def named(cls, why: str) -> Cut:
        """The cut an ``Interrupted(why)`` names; an unknown reason is a time limit, as it always was."""
        try:
            return cls(why)
        except ValueError:
            return cls.TIMEOUT


class Classification(enum.StrEnum):
    """What kind of error a body raised (workers.errors: classification is explicit)."""

    RETRYABLE = "retryable"  # Retryable (or a subclass): retried within the attempt budget
    CONNECTION_LOST = "connection_lost"  # the body lost the database: transient, nothing after it was recorded
    TERMINAL = "terminal"  # TerminalFailure: no retry can fix it
    FATAL = "fatal"  # anything else: never retried blindly, it may have half-done an effect

    @classmethod
    def of(cls, error: BaseException) -> Classification:
        if isinstance(error, OperationalError | InterfaceError):
            return cls.CONNECTION_LOST
        if isinstance(error, Retryable):
            return cls.RETRYABLE
        if isinstance(error, TerminalFailure):
            return cls.TERMINAL
        return cls.FATAL


@dataclass(frozen=True)
class Returned:
    """The body returned ``value``; ``state_delta`` is what it set with ctx.set_state."""

    value: Any
    state_delta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Parked:
    """The safety layer set the job aside (review, needs attention, budget): errors.Park."""

    reason: str
    detail: str
    parked_on: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reconciling:
    """An operation's outcome is still open and the provider may settle it soon (errors.ReconcileLater)."""

    detail: str
    delay_seconds: float


@dataclass(frozen=True)
class GivenBack:
    """Nothing of the body is half-done: it never started (a lease claimed for an acquire that had
    ended, an HTTP worker releasing a lease it had not begun), or it stopped at a checkpoint (a stop
    pause: errors.Paused; a worker shutting down at a safe point). ``why`` is what the attempt row says."""

    why: str


@dataclass(frozen=True)
class Interrupted:
    """The runtime cut the body off mid-way (errors.Interrupted, raised by SIGALRM)."""

    why: Cut


@dataclass(frozen=True)
class Stale:
    """The engine rejected one of this attempt's writes (errors.StaleAttempt)."""

    rejection: Rejection


@dataclass(frozen=True)
class Raised:
    """The body raised ``error`` (any Exception that is none of the above)."""

    error: BaseException
    classification: Classification

    @classmethod
    def of(cls, error: BaseException) -> Raised:
        return cls(error=error, classification=Classification.of(error))


@dataclass(frozen=True)
class Unservable:
    """No body ran: this worker does not serve the job's kind@version. ``earlier`` counts the
    job's earlier unservable attempts (the backoff grows with it)."""

    worker: str
    earlier: int


@dataclass(frozen=True)
class Reported:
    """A worker elsewhere (the HTTP protocol's fail call) reported how its body failed: the
    classification, the error's class name and its message (text only, never a stack trace)."""

    classification: Classification  # RETRYABLE, TERMINAL or FATAL
    error_class: str
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class OverLimit:
    """The attempt went past a ceiling of its kind (workers.bounds): its body raised MemoryError or
    was told by SIGXCPU, or its work horse died of it (then the forking parent reports it)."""

    limit: Limit
    limits: Limits
    killed: bool = False  # the work horse died of it: the parent saw its exit


# The error name an attempt row records for each ceiling, and the job's reason when it is the last.
LIMIT_ERRORS = {Limit.MEMORY: "MemoryLimitExceeded", Limit.CPU: "CpuLimitExceeded"}
LIMIT_REASONS = {Limit.MEMORY: FailureReason.MEMORY_LIMIT, Limit.CPU: FailureReason.CPU_LIMIT}

Ending = Returned | Parked | Reconciling | GivenBack | Interrupted | Stale | Raised | Unservable | Reported | OverLimit

# -- decisions: the one lease transition to record -------------------------------------------------


@dataclass(frozen=True)
class Complete:
    """Succeeded, with the result and the run-state delta."""

    result: Any
    state_delta: dict[str, Any]


@dataclass(frozen=True)
class RetryLater:
    """Back to the queue after ``delay_seconds``; the attempt is used."""

    delay_seconds: float
    error_class: str
    message: str


@dataclass(frozen=True)
class Fail:
    """The job ends failed with ``reason``."""

    reason: FailureReason
    error_class: str
    message: str


@dataclass(frozen=True)
class Park:
    """Set aside for a person or a budget; the attempt is given back."""

    reason: str
    detail: str
    parked_on: dict[str, Any]


@dataclass(frozen=True)
class Release:
    """Back to the queue without using an attempt (due after ``delay_seconds``)."""

    outcome: Outcome  # INTERRUPTED or UNSERVABLE: what the attempt row says
    message: str
    delay_seconds: float = 0.0


@dataclass(frozen=True)
class Discard:
    """No write: the attempt is stale and nothing it says may count. The reaper, the newer
    attempt or the cancel that made it stale owns the job's outcome."""

    rejection: Rejection | None


Decision = Complete | RetryLater | Fail | Park | Release | Discard

# -- the decision ------------------------------------------------------------------------------------


def decide(
    ending: Ending,
    lease: Lease,
    kind: JobKind | None,
    *,
    rejected: Rejection | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """The lease transition that records ``ending`` of attempt ``lease``.

    ``kind`` is the registered kind that ran (None only for Unservable and GivenBack: no body ran,
    or none that left anything to mask). ``rejected`` is the
    rejection the engine already answered this attempt (a heartbeat's), if any: then only a
    body that returned still reports (its fenced write gets the rejection back by name), and
    anything else is discarded. ``rng`` feeds the backoff's jitter (kinds.JobKind.backoff_seconds).
    """
    if isinstance(ending, Unservable):
        delay = min(UNSERVABLE_MAX_DELAY, 0.5 * 2**ending.earlier)
        return Release(
            outcome=Outcome.UNSERVABLE,
            message=f"worker {ending.worker} does not serve {lease.kind}@{lease.version}",
            delay_seconds=delay,
        )
    if rejected is not None and not isinstance(ending, Returned):
        return Discard(rejection=rejected)
    if isinstance(ending, GivenBack):
        # A safe point: nothing is half-done, so even at_most_once is given back.
        return Release(outcome=Outcome.INTERRUPTED, message=ending.why)
    if kind is None:
        raise ValueError(f"deciding a {type(ending).__name__} ending needs the kind that ran")
    # The job's own context (its declared values and their fragments), joined to whatever is
    # bound: the runtime's attempt context already holds it (merged() then returns that one,
    # indexed once), and a caller outside an attempt still gets the job's values masked.
    redactor = redaction.current().merged(kind.redactor(lease.input))
    match ending:
        case Stale(rejection=rejection):
            return Discard(rejection=rejection)
        case Interrupted(why=Cut.STALE):
            # Only armed after a heartbeat was rejected (``rejected`` is then set): stale either way.
            return Discard(rejection=rejected)
        case Returned(value=value, state_delta=state_delta):
            # What jsonb refuses (NaN, Infinity, a NUL) would make the end's write fail, and the
            # job would be run again and again by worker after worker: a body's bug, said once.
            unstorable = storable.json_problem(value, path="result") or storable.json_problem(state_delta, path="state_delta")
            if unstorable:
                return Fail(
                    reason=FailureReason.FATAL,
                    error_class="UnstorableResult",
                    message=f"the body's {unstorable}: a result and a state delta are stored as JSON (no NaN, Infinity or NUL)",
                )
            return Complete(result=value, state_delta=dict(state_delta))
        case Reconciling(detail=detail, delay_seconds=delay):
            return Release(outcome=Outcome.INTERRUPTED, message=redactor.text(detail), delay_seconds=delay)
        case Parked(reason=reason, detail=detail, parked_on=parked_on):
            return Park(reason=reason, detail=detail, parked_on=dict(parked_on))
        case Interrupted(why=Cut.SHUTDOWN | Cut.PAUSED):
            # Cut off mid-body (a stop pause that outlived its grace is exactly a shutdown).
            if lease.delivery == Delivery.AT_MOST_ONCE:
                # The body may already have had its effect. Releasing it would run it a second
                # time: at_most_once fails instead, as the reaper does.
                return Fail(
                    reason=FailureReason.ORPHANED,
                    error_class="Interrupted",
                    message="interrupted at the worker's shutdown deadline; at_most_once does not run a body twice",
                )
            return Release(outcome=Outcome.INTERRUPTED, message="released at worker shutdown deadline")
        case Interrupted(why=Cut.DEADLINE):
            return _failure(
                TerminalFailure("the job's overall deadline passed during the attempt"),
                FailureReason.DEADLINE_EXCEEDED,
                lease,
                kind,
                redactor,
                rng,
            )
        case Interrupted():
            timeout = AttemptTimeout(f"attempt exceeded its time limit of {lease.timeout_seconds:g}s")
            return _failure(timeout, FailureReason.FATAL, lease, kind, redactor, rng)
        case Raised(error=error, classification=Classification.CONNECTION_LOST):
            # The body lost the database (a partition, a session the server ended for idling in a
            # transaction, a failover): transient by nature, and nothing after it was recorded.
            lost = Retryable(f"database connection lost during the attempt ({type(error).__name__})")
            return _failure(lost, FailureReason.FATAL, lease, kind, redactor, rng)
        case Raised(error=error, classification=Classification.TERMINAL):
            return _failure(error, FailureReason.TERMINAL, lease, kind, redactor, rng)
        case Raised(error=error):
            return _failure(error, FailureReason.FATAL, lease, kind, redactor, rng)
        case OverLimit(limit=limit, limits=limits, killed=killed):
            message = describe(limit, limits) + ("; the work horse was killed" if killed else "")
            if lease.delivery == Delivery.AT_MOST_ONCE:
                # Cut off mid-body: it may have had its effect, and at_most_once never runs twice.
                return Fail(reason=LIMIT_REASONS[limit], error_class=LIMIT_ERRORS[limit], message=message)
            failed = _retry_or_fail(
                retryable=True,
                retry_after=None,
                reason=LIMIT_REASONS[limit],
                error_class=LIMIT_ERRORS[limit],
                message=message,
                lease=lease,
                kind=kind,
                rng=rng,
            )
            if isinstance(failed, Fail):  # attempts spent: the job's reason names the ceiling
                return dataclasses.replace(failed, reason=LIMIT_REASONS[limit])
            return failed
        case Reported(classification=classification, error_class=error_class, message=message, retry_after=retry_after):
            return _retry_or_fail(
                retryable=classification is Classification.RETRYABLE,
                retry_after=retry_after,
                reason=FailureReason.TERMINAL if classification is Classification.TERMINAL else FailureReason.FATAL,
                error_class=error_class,
                message=redactor.text(message),
                lease=lease,
                kind=kind,
                rng=rng,
            )
    raise TypeError(f"not an ending: {ending!r}")


def error_class_of(error: BaseException) -> str:
    """What the records call an error: its class, with a TerminalFailure's code when it has its own
    (``TerminalFailure:declined``); a StepFailure (the HTTP SDK's name) by its code alone, as the
    SDK reports it, so a body records the same name whichever kind of worker runs it."""
    name = type(error).__name__
    if isinstance(error, StepFailure):
        return error.error_class  # as the HTTP SDK names it: the code, or the class name without one
    if isinstance(error, TerminalFailure) and error.code != "terminal":
        return f"{name}:{error.code}"
    return name


def _failure(
    error: BaseException,
    reason: FailureReason,
    lease: Lease,
    kind: JobKind,
    redactor: Redactor,
    rng: random.Random | None,
) -> RetryLater | Fail:
    """What a raised error records: its name and redacted message, under the one retry rule."""
    return _retry_or_fail(
        retryable=isinstance(error, Retryable),
        retry_after=error.retry_after if isinstance(error, Retryable) else None,
        reason=reason,
        error_class=error_class_of(error),
        message=redactor.text(str(error)),
        lease=lease,
        kind=kind,
        rng=rng,
    )


def _retry_or_fail(
    *,
    retryable: bool,
    retry_after: float | None,
    reason: FailureReason,
    error_class: str,
    message: str,
    lease: Lease,
    kind: JobKind,
    rng: random.Random | None,
) -> RetryLater | Fail:
    """The one retry rule: a retryable failure retries while attempts remain (after its own
    retry-after, else the kind's backoff), then fails attempts_exhausted; anything else fails with
    ``reason`` at once."""
    if retryable:
        if lease.attempts < lease.max_attempts:
            delay = retry_after if retry_after is not None else kind.backoff_seconds(lease.attempts, rng=rng)
            return RetryLater(delay_seconds=delay, error_class=error_class, message=message)
        reason = FailureReason.ATTEMPTS_EXHAUSTED
    return Fail(reason=reason, error_class=error_class, message=message)
