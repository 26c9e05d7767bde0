"""What a job body may raise, and what the engine answers a stale attempt.

Classification is explicit: ``Retryable`` retries within the attempt budget,
``TerminalFailure`` ends the job at once, anything else is fatal (never retried
blindly, because an unknown error may have half-done an outbound effect). The HTTP SDK's
names for the first two, ``RetryableError`` and ``StepFailure``, are their subclasses here,
so one body's vocabulary works in both runtimes. A kind's author imports them from the
public root (``from workers import Retryable, StepFailure``).
"""

from __future__ import annotations

import enum


class Retryable(Exception):
    """A transient error (timeout, 5xx, storage blip). Optionally carries retry-after seconds."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TerminalFailure(Exception):
    """A typed failure that no retry can fix (unauthorized account, unsupported format)."""

    code = "terminal"

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


# -- The HTTP SDK's names (koala_worker.RetryableError, StepFailure), for bodies in either runtime ---


class RetryableError(Retryable):
    """The HTTP SDK's name for a transient error (``koala_worker.RetryableError``): a Retryable,
    recorded as ``RetryableError``, as an HTTP worker records it."""

    def __init__(self, message: str = "", retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)


class StepFailure(TerminalFailure):
    """The HTTP SDK's name for a typed failure (``koala_worker.StepFailure``): a TerminalFailure,
    recorded as an HTTP worker records it: by its code alone (``StepFailure("…", code="x")`` is
    ``x``), or by its class name without a code. A TerminalFailure's is ``TerminalFailure:<code>``."""

    code = ""

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message, code=code)

    @property
    def error_class(self) -> str:
        return self.code or type(self).__name__


class Rejection(enum.StrEnum):
    """The closed set of reasons an attempt may no longer act (HTTP 409 + reason in the API).

    Workers handle each by name:
    - ``lease_expired``: the lease ran out before this call and nobody has taken the job
      since. Stop the body; the reaper requeues (at_least_once) or fails (at_most_once).
    - ``lease_superseded``: another attempt has claimed the job since (fencing). Stop; the
      other attempt owns the outcome. Never report success or failure for it.
    - ``job_cancelled``: an operator cancelled the job. Stop at the next safe point.
    - ``already_recorded``: this attempt's report was already stored (an idempotent
      repeat, e.g. after a lost reply). Treat as success of the report.
    """

    LEASE_EXPIRED = "lease_expired"
    LEASE_SUPERSEDED = "lease_superseded"
    JOB_CANCELLED = "job_cancelled"
    ALREADY_RECORDED = "already_recorded"


class StaleAttempt(Exception):
    """Raised inside the runtime when the engine rejected this attempt's write."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.value)
        self.rejection = rejection


class EnqueueError(ValueError):
    """Bad enqueue input: unknown kind, malformed input, or a reused key with other input."""


class JobStateError(ValueError):
    """An operator action that does not apply to the job's current state."""


class Interrupted(BaseException):
    """Raised into a body that overran its time limit or the shutdown deadline.

    A BaseException so a body's broad ``except Exception`` cannot swallow it.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class AttemptTimeout(Retryable):
    """The attempt overran its kind's per-attempt time limit; retried like any transient error."""


# -- Outbound calls (raised by a perform() callable given to ctx.operation) -------------------


class OutcomeUnknown(Exception):
    """The request may have reached the provider, and no answer came back (timeout after
    sending, 5xx, connection reset). The operation becomes ``uncertain``; the job is retried
    and the retry reconciles before it sends anything again."""


class NotPerformed(Exception):
    """The provider definitely did not act (429, connection refused before sending).
    The operation is ``failed`` and safe to re-send; the job is retried after ``retry_after``."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Declined(Exception):
    """The provider refused for good (card declined, invalid request): the job fails terminally."""


class OperationMismatch(TerminalFailure):
    """An operation key was reused with different parameters: never send the other request under it."""

    code = "operation_mismatch"


class SafetyError(ValueError):
    """Bad input to a safety-layer service (budget, pause, review, operation resolution)."""


class UnknownName(EnqueueError, SafetyError):
    """A person named a queue, job kind or scope Koala does not know (a typo, a retired name).

    Both an EnqueueError and a SafetyError, so every caller of the enqueue, pause and budget
    services that already handles its service's error handles this one; ``what`` and ``name``
    say which name was refused.
    """

    def __init__(self, what: str, name: str, known: list[str]) -> None:
        self.what, self.name, self.known = what, name, known
        shown = repr(name) if len(name) <= 40 else repr(name[:37]) + "…"
        listed = ", ".join(known)
        if len(listed) > 160:
            listed = listed[:157].rsplit(", ", 1)[0] + f", … ({len(known)} in all)"
        label = "job kind" if what == "kind" else what
        super().__init__(f"unknown {label} {shown}; {'known' if what != 'queue' else 'configured'}: {listed or 'none'}.")


class Park(BaseException):
    """Raised inside a body by the safety layer to set the job aside without using an attempt.

    A BaseException so a body's broad ``except Exception`` cannot swallow it. The runtime
    answers it with a ``Park`` decision (workers.transitions): the lease is released, no worker waits.
    """

    def __init__(self, reason: str, detail: str, parked_on: dict[str, object] | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.parked_on = parked_on or {}


class ReconcileLater(Park):
    """Raised by the ledger when an operation's outcome is still open and the provider may settle
    it soon (it is still processing, its lookup missed inside its processing window, or the lookup
    itself failed). The runtime releases the job without using an attempt, due again after
    ``delay_seconds``; the operation stays open with its reservation held. The ledger bounds the
    waiting (``KOALA_RECONCILE_MAX_WAIT_SECONDS``) and then parks the job for a person."""

    def __init__(self, detail: str, *, delay_seconds: float, parked_on: dict[str, object] | None = None) -> None:
        super().__init__("reconcile_later", detail, parked_on)
        self.delay_seconds = delay_seconds


class Paused(BaseException):
    """Raised by ``ctx.checkpoint()`` when a stop-mode pause covers the running job."""
