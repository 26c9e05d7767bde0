"""What a body gets: ``body(ctx, input)``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from koala_worker.errors import (
    Abandon,
    Declined,
    NotPerformed,
    OperationFailed,
    OutcomeUnknown,
    Rejected,
    RetryableError,
    StepFailure,
    StopRequested,
    TerminalFailure,
)
from koala_worker.lease import Lease
from koala_worker.spans import Span, SpanRecorder, add_usage, usage_of

if TYPE_CHECKING:
    from koala_worker.worker import LeaseRun


@dataclass(frozen=True)
class OperationResult:
    """What perform() or a successful reconcile() returns (as in an RQ worker's ctx.operation)."""

    external_id: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    cost_minor: int | None = None
    usage: dict[str, Any] | None = None


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()  # reconcile(): the provider has no record of this key; safe to send again


@dataclass(frozen=True)
class Miss:
    """reconcile(): no record of the key now; proof of absence only once ``window_seconds`` passed."""

    window_seconds: float


@dataclass(frozen=True)
class Processing:
    """reconcile(): the provider has the request under this key and has not finished it."""

    window_seconds: float


Perform = Callable[[str], OperationResult]
Reconcile = Callable[[str], "OperationResult | _Absent | Miss | Processing | None"]
MAX_OPERATION_ROUNDS = 8  # begin → look_up → begin … a server that keeps asking to look again is answered by failing


def lookup_payload(answer: Any) -> dict[str, Any]:
    """A reconcile() answer as the ``lookup`` of the next begin."""
    if isinstance(answer, OperationResult):
        return {
            "found": {
                "external_id": answer.external_id,
                "data": answer.data,
                "cost_minor": answer.cost_minor,
                "usage": answer.usage,
            }
        }
    if answer is ABSENT:
        return {"absent": True}
    if isinstance(answer, Miss):
        return {"miss": {"window_seconds": answer.window_seconds}}
    if isinstance(answer, Processing):
        return {"processing": {"window_seconds": answer.window_seconds}}
    return {"unknown": True}


def raise_for(answer: dict[str, Any]) -> None:
    """Act on an operation answer that is not ``done``/``send``/``look_up``: stop or raise."""
    action = answer.get("action")
    if action == "stop":
        raise Abandon(f"operation stop: {answer.get('reason') or 'parked'}")
    if action == "raise":
        message = str(answer.get("message") or "")
        classification = answer.get("classification")
        if classification == "retryable":
            raise RetryableError(message, retry_after=answer.get("retry_after"))
        if classification == "step_failure":
            error_class = str(answer.get("error_class") or "operation_failed")
            # "TerminalFailure:declined" (a declined charge): the engine's own name, raised as the
            # alias an in-process body would meet, whose error_class is the same string.
            named, _, code = error_class.partition(":")
            if named == "TerminalFailure":
                raise TerminalFailure(message, code=code or None)
            raise StepFailure(message, code=error_class)
        raise OperationFailed(message)
    raise OperationFailed(f"Koala answered an operation with an unknown action {action!r}")


class Context:
    """The body's view of its lease. Thread-safe where a body's helper threads may reach it."""

    def __init__(self, run: LeaseRun) -> None:
        self._run = run
        lease = run.lease
        self.lease: Lease = lease
        self.input: Any = lease.input
        self.steps: dict[str, Any] = lease.steps
        self.state: dict[str, Any] = lease.state
        self.progress_checkpoint: dict[str, Any] = lease.progress
        self.step: str | None = lease.step
        self.run: dict[str, Any] | None = lease.run  # a workflow step's run: {"id", "state", "correlation_id"}
        self.cancelled = threading.Event()
        self.state_delta: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None  # set_usage's, when called
        self.spans = SpanRecorder(lease.span_id)
        self._lock = threading.Lock()
        self._pending_progress: dict[str, Any] | None = None

    # -- the lease's fields ----------------------------------------------------------------

    @property
    def job_id(self) -> int:
        return self.lease.job_id

    @property
    def run_id(self) -> int | None:
        """The run of a workflow's step (None for a job of its own)."""
        return int(self.run["id"]) if self.run and isinstance(self.run.get("id"), int) else None

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def idempotency_key(self) -> str:
        return self.lease.idempotency_key

    @property
    def trace_id(self) -> str:
        return self.lease.trace_id

    @property
    def span_id(self) -> str:
        return self.lease.span_id

    @property
    def correlation_id(self) -> str:
        return self.lease.correlation_id

    # -- what a body records ---------------------------------------------------------------

    def progress(self, **checkpoint: Any) -> None:
        """The checkpoint a retry resumes from (``ctx.progress_checkpoint``); sent with the next heartbeat."""
        with self._lock:
            self._pending_progress = dict(checkpoint)

    def take_progress(self) -> dict[str, Any] | None:
        with self._lock:
            pending, self._pending_progress = self._pending_progress, None
            return pending

    def restore_progress(self, pending: dict[str, Any]) -> None:
        """A heartbeat that did not get through: send its checkpoint with the next one (unless a newer one came)."""
        with self._lock:
            if self._pending_progress is None:
                self._pending_progress = pending

    def set_state(self, **delta: Any) -> None:
        """Top-level keys merged into the run's state when the step completes."""
        with self._lock:
            self.state_delta.update(delta)

    def set_usage(self, *, model: str = "", input_tokens: int = 0, output_tokens: int = 0) -> None:
        """The step's usage, set explicitly (otherwise it is the sum of the spans' usage)."""
        self.usage = usage_of(model, input_tokens, output_tokens)

    def span(self, name: str) -> Span:
        return self.spans.span(name)

    def step_usage(self) -> dict[str, Any] | None:
        """The step's usage: set_usage's, else the sum of the spans' (a sum over several models keeps
        the first model's name and carries ``mixed_models``)."""
        if self.usage is not None:
            return self.usage
        return add_usage(None, self.spans.total)

    def wire_usage(self) -> dict[str, Any] | None:
        """What complete sends as ``usage``: set_usage's only. Without it Koala sums the spans' own
        usage, pricing each with its own model, which a single summed usage could not do. Only when
        spans past the contract's limit were left out is the sum sent (else their usage is lost),
        and only when it has one model."""
        if self.usage is not None:
            return self.usage
        total = self.step_usage()
        if self.spans.dropped and total and not total.get("mixed_models"):
            return total
        return None

    def checkpoint(self) -> None:
        """A safe point: raise if the worker must stop the body here (see ``cancelled``)."""
        if self._run.rejection is not None:
            raise Abandon(self._run.rejection)
        if self._run.stop_requested:
            raise StopRequested("the worker asked the body to stop")

    # -- operations ------------------------------------------------------------------------

    def operation(
        self,
        name: str,
        *,
        kind: str,
        params: dict[str, Any],
        perform: Perform,
        reconcile: Reconcile | None = None,
        amount_minor: int | None = None,
        currency: str = "",
        target: str = "",
        estimate_minor: int = 0,
        key: str | None = None,
    ) -> Any:
        """Record one outbound side effect in Koala's operations ledger, then perform it (at most once per key).

        Returns the result's data (a re-run after success returns the stored data without calling
        out). ``perform(key)`` raises NotPerformed, Declined or OutcomeUnknown to say how a call
        failed; ``reconcile(key)`` answers an open outcome with OperationResult, ABSENT, Miss,
        Processing or None (cannot tell).
        """
        self.checkpoint()
        worker = self._run.worker
        lookup: dict[str, Any] | None = None
        begin = functools.partial(
            worker.client.begin_operation,
            worker.worker_id,
            self.lease,
            name=name,
            kind=kind,
            params=params,
            amount_minor=amount_minor,
            currency=currency,
            target=target,
            estimate_minor=estimate_minor,
            key=key,
            can_look_up=reconcile is not None,
        )
        for _ in range(MAX_OPERATION_ROUNDS):
            answer = self._call(functools.partial(begin, lookup=lookup))
            action = answer.get("action")
            if action == "done":
                return answer.get("result")
            if action == "look_up":
                lookup = self._look_up(reconcile, str(answer.get("key") or key or ""))
                continue
            if action == "send":
                return self._send(perform, answer)
            raise_for(answer)
        raise OperationFailed(f"operation {name!r}: no decision after {MAX_OPERATION_ROUNDS} lookups")

    def _call(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return self._run.worker.persist(call, self._run)
        except Rejected as exc:
            self._run.reject(exc.reason.value)
            raise Abandon(exc.reason.value) from None

    @staticmethod
    def _look_up(reconcile: Reconcile | None, key: str) -> dict[str, Any]:
        if reconcile is None:
            return {"unknown": True}
        try:
            return lookup_payload(reconcile(key))
        except (OutcomeUnknown, NotPerformed, RetryableError) as exc:
            failed: dict[str, Any] = {"failed": str(exc)}
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                failed["retry_after"] = retry_after
            return failed
        except Exception:  # the lookup failed in a way retrying will not fix: nobody can tell
            return {"unknown": True}

    def _send(self, perform: Perform, answer: dict[str, Any]) -> Any:
        operation_id = int(answer["operation_id"])
        key = str(answer.get("key") or "")
        worker = self._run.worker
        settle: dict[str, Any]
        error: Exception | None = None
        try:
            result = perform(key)
            if not isinstance(result, OperationResult):
                raise TypeError(f"perform() must return an OperationResult, not {type(result).__name__}")
            settle = {
                "outcome": "succeeded",
                "external_id": result.external_id,
                "data": result.data,
                "cost_minor": result.cost_minor,
                "usage": result.usage,
            }
        except NotPerformed as exc:
            settle = {"outcome": "not_performed", "message": str(exc), "retry_after": exc.retry_after}
        except Declined as exc:
            settle = {"outcome": "declined", "message": str(exc)}
        except OutcomeUnknown as exc:
            settle = {"outcome": "unknown", "message": str(exc)}
        except Exception as exc:
            # An unclassified error after the request may have left: the outcome is unknown, and
            # the body fails with the error itself (fatal unless it is one of the SDK's).
            settle = {"outcome": "unknown", "message": f"{type(exc).__name__}: {exc}"}
            error = exc
        settled = self._call(lambda: worker.client.settle_operation(worker.worker_id, self.lease, operation_id, **settle))
        if settled.get("action") == "done" and error is None:
            return settled.get("result")
        if settled.get("action") == "stop":
            raise_for(settled)
        if error is not None:
            raise error
        raise_for(settled)
