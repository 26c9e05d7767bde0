"""Errors of the protocol (raised by ``Client``) and the ones a body raises to classify its failure."""

from __future__ import annotations

import enum


class KoalaError(Exception):
    """Base of every error the client raises."""


class Reason(enum.StrEnum):
    """The closed set of reasons a ``409`` carries (docs/worker-api.md, "The four rejections")."""

    LEASE_EXPIRED = "lease_expired"
    LEASE_SUPERSEDED = "lease_superseded"
    JOB_CANCELLED = "job_cancelled"
    ALREADY_RECORDED = "already_recorded"


class Rejected(KoalaError):
    """A ``409``: Koala cannot accept a call about this lease. Handle each ``reason`` by name."""

    reason: Reason

    def __init__(self, reason: Reason | str, message: str = "") -> None:
        self.reason = Reason(reason)
        self.message = message
        super().__init__(f"{self.reason.value}: {message}" if message else self.reason.value)

    @staticmethod
    def of(reason: str, message: str = "") -> Rejected:
        return _BY_REASON[Reason(reason)](message)


class LeaseExpired(Rejected):
    def __init__(self, message: str = "") -> None:
        super().__init__(Reason.LEASE_EXPIRED, message)


class LeaseSuperseded(Rejected):
    def __init__(self, message: str = "") -> None:
        super().__init__(Reason.LEASE_SUPERSEDED, message)


class JobCancelled(Rejected):
    def __init__(self, message: str = "") -> None:
        super().__init__(Reason.JOB_CANCELLED, message)


class AlreadyRecorded(Rejected):
    def __init__(self, message: str = "") -> None:
        super().__init__(Reason.ALREADY_RECORDED, message)


_BY_REASON: dict[Reason, type[Rejected]] = {
    Reason.LEASE_EXPIRED: LeaseExpired,
    Reason.LEASE_SUPERSEDED: LeaseSuperseded,
    Reason.JOB_CANCELLED: JobCancelled,
    Reason.ALREADY_RECORDED: AlreadyRecorded,
}


class ApiError(KoalaError):
    """Any other refusal: ``status`` (``0`` when no answer came), ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth trying again as is: no answer, a 5xx, or a 429."""
        return self.status == 0 or self.status >= 500 or self.status == 429


class Unavailable(ApiError):
    """No answer: the connection was refused, reset or timed out (a server restart, a network blip)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "unavailable", message)


# -- What a body raises ------------------------------------------------------------------------


class RetryableError(Exception):
    """Try the step again (within its retry budget), after ``retry_after`` seconds if given."""

    def __init__(self, message: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StepFailure(Exception):
    """A typed failure no retry fixes: the job fails ``terminal``; ``error_class`` is ``code`` or the class name."""

    code: str | None = None

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def error_class(self) -> str:
        return self.code or type(self).__name__


# The in-process engine's names for the same two (``from workers import Retryable, TerminalFailure``
# in a Koala job kind), so one body's vocabulary works in either runtime. Each is recorded under
# the name an RQ worker records it by: ``Retryable``, ``TerminalFailure`` or ``TerminalFailure:<code>``.


class Retryable(RetryableError):
    """The engine's name for a retryable error (``workers.Retryable``); ``error_class`` ``Retryable``."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)


class TerminalFailure(StepFailure):
    """The engine's name for a typed failure (``workers.TerminalFailure``): a step failure whose
    ``error_class`` is ``TerminalFailure:<code>``, or ``TerminalFailure`` without a code of its own
    (a subclass: its own class name). A declined charge Koala answers an operation with is one."""

    code: str | None = "terminal"

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message, code=code or None)  # an empty code keeps the default, as in the engine

    @property
    def error_class(self) -> str:
        name = type(self).__name__
        return name if self.code in (None, "terminal") else f"{name}:{self.code}"


class OperationFailed(Exception):
    """Koala answered an operation with ``raise`` and a ``fatal`` classification."""


class StopRequested(BaseException):
    """Raised by ``ctx.checkpoint()`` when the worker asks the body to stop (a stop pause, a shutdown).

    Raised at a safe point, so the lease is given back with ``safe_point: true`` (no attempt used).
    A BaseException so that a body's broad ``except Exception`` does not swallow it.
    """


class Abandon(BaseException):
    """Internal: the lease is gone (a 409 on a heartbeat or an operation) or Koala parked the job
    (operation ``stop``). The body ends and the worker reports nothing more about this lease."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


# -- What perform()/reconcile() raise in ctx.operation (as in an RQ worker's ctx.operation) -----


class OutcomeUnknown(Exception):
    """The request may have reached the provider and no answer came back (timeout, 5xx, reset)."""


class NotPerformed(Exception):
    """The provider definitely did not act; safe to send again after ``retry_after``."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Declined(Exception):
    """The provider refused for good (a declined card, an invalid request)."""
