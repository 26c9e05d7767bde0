"""The body API: what a job body gets besides its input (``ctx`` in ``def body(ctx, data)``).

Signals (``cancelled``, ``shutting_down``), checkpoints, progress, run state, usage, and
outbound side effects through the operations ledger. The runtime (workers.runtime) creates
one per attempt; a body never sees the runtime itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from django.utils import timezone

from workers.errors import Paused, Rejection, StaleAttempt
from workers.kinds import JobKind
from workers.ledger import Perform, Reconcile, run_operation
from workers.models import Operation, operation_key_base
from workers.services import leases
from workers.services.leases import Lease
from workers.spans import OpenSpan, SpanRecorder, attempt_span_id


class Runtime(Protocol):
    """What a context needs from the process running it (workers.runtime.WorkerRuntime)."""

    name: str
    shutdown_requested: threading.Event

    @property
    def lease_seconds(self) -> float: ...

    def beat(self, ctx: JobContext) -> None: ...


class JobContext:
    """What a body gets besides its input: signals, checkpoints, state and usage.

    ``cancelled`` is set when the lease is lost, the job is cancelled, a stop-mode pause
    covers it, or the run's time is up; a long body should call ``checkpoint()`` between
    steps, which raises the right exception for the runtime to act on.
    """

    def __init__(self, lease: Lease, kind: JobKind, runtime: Runtime) -> None:
        self.lease = lease
        self.kind = kind
        self.job_id = lease.job_id
        self.attempt_id = lease.attempt_id
        self.created_by = lease.created_by
        self.attempt = lease.attempts
        self.input = lease.input
        # What this attempt masks in every sink (bound by the runtime around the body and its
        # report): the kind's sensitive fields and their values in the input.
        self.redactor = kind.redactor(lease.input)
        self.run_state = lease.run_state
        # A workflow's step (workers.definitions): its name, its run, and the outputs of the steps
        # it follows by name; "" / None / {} for a job of its own.
        self.step = lease.step
        self.run_id = lease.run_id
        self.steps = lease.steps
        self.previous_progress = lease.progress
        self.correlation_id = lease.correlation_id
        self.trace_id = lease.trace_id
        # This attempt's span in the job's trace (stable for the attempt); the body's own spans
        # (span(), and one per ledger operation) hang under it, handed over when the attempt ends.
        self.span_id = attempt_span_id(trace_id=lease.trace_id, job_id=lease.job_id, lease_token=lease.lease_token)
        self.spans = SpanRecorder(self.span_id)
        # Stable across retries of this job, and carried by an operator retry from its original
        # (Job.operation_key_base): the idempotency key for outbound calls, so a retry's steps
        # find the original's ledger rows and can never send an effect twice.
        self.idempotency_key = operation_key_base(
            job_id=lease.job_id, idempotency_key=lease.idempotency_key, carried=lease.operation_key_base
        )
        self.worker_name = runtime.name
        self.cancelled = threading.Event()
        self.shutting_down = runtime.shutdown_requested
        self.rejection: Rejection | None = None
        self.state_delta: dict[str, Any] = {}
        self.usage: dict[str, float] = {}  # the body's own (add_usage): reported when the attempt ends
        self.counted: dict[str, float] = {}  # what its operations cost: already on the job (workers.ledger)
        self.waits = {"db": 0.0, "storage": 0.0}
        self._pending_progress: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._runtime = runtime
        now = time.monotonic()
        self.time_limit_at: float | None = now + lease.timeout_seconds
        self.deadline_at: float | None = now + (lease.deadline_at - timezone.now()).total_seconds() if lease.deadline_at else None
        self.stale_stop_at: float | None = None
        self.paused = False  # a stop-mode pause covers this job: release it at the next safe point
        self.pause_stop_at: float | None = None
        self.last_beat_at = now

    # -- body API ----------------------------------------------------------------
    def progress(self, **checkpoint: Any) -> None:
        """Store a checkpoint with the next heartbeat (a retry finds it in previous_progress)."""
        with self._lock:
            self._pending_progress = checkpoint

    def heartbeat(self) -> None:
        """Heartbeat now (e.g. between long batches) and raise StaleAttempt if the lease is gone."""
        self._runtime.beat(self)
        self.checkpoint()

    def confirm_lease(self) -> None:
        """Renew the lease now and raise StaleAttempt if it is gone (the ledger calls this right
        before each outbound call). A database error propagates: without a confirmed lease
        nothing may be sent."""
        rejection = leases.heartbeat(
            job_id=self.job_id, lease_token=self.lease.lease_token, lease_seconds=self._runtime.lease_seconds
        )
        if rejection is not None:
            self.reject(rejection)
            raise StaleAttempt(rejection)
        self.last_beat_at = time.monotonic()

    def hold_lease(self) -> None:
        """The strict fence, for a write to a table other than the job's: lock this attempt's job
        row until the current transaction ends, or raise StaleAttempt (and stop the body).

        Call it first inside the ``transaction.atomic()`` that writes (the ledger, export records
        and budget reservations do): while it holds, no reclaim, requeue or cancel can change the
        job, so the write commits only for the attempt that owns it (leases.hold_lease)."""
        rejection = leases.hold_lease(job_id=self.job_id, lease_token=self.lease.lease_token)
        if rejection is not None:
            self.reject(rejection)
            raise StaleAttempt(rejection)

    def checkpoint(self) -> None:
        """Raise StaleAttempt if this attempt may no longer act, Paused if a stop pause covers it."""
        if self.rejection is not None:
            raise StaleAttempt(self.rejection)
        if self.paused:
            raise Paused("a stop-mode pause covers this job")

    def operation(
        self,
        name: str,
        *,
        kind: str,
        params: dict[str, Any],
        perform: Perform,
        reconcile: Reconcile | None = None,
        key: str | None = None,
        estimate_minor: int = 0,
        amount_minor: int | None = None,
        currency: str = "",
        target: str = "",
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Run one outbound side effect through the operations ledger (workers/ledger.py, docs/safety.md).

        The step's row is committed ``in_flight`` before ``perform`` is called, under a key stable
        across retries; a re-run after success returns the stored data without calling out, and an
        outcome a crash or a timeout left open is settled through ``reconcile`` first.

        - ``name``: the step, unique within the job (``"charge"``); with the job it makes the key.
        - ``kind``: what sort of effect it is (``"charge"``, ``"email"``, ``"model_call"``): shown to
          people, in reviews and in the ledger.
        - ``params``: the request, as JSON; its fingerprint must match on every re-run (the same key
          with other parameters is refused, OperationMismatch). Stored redacted.
        - ``perform(key)``: makes the call with ``key`` as the provider's idempotency key and returns
          an OperationResult; raises NotPerformed (it did not happen: retried), Declined (refused
          for good: the job fails ``TerminalFailure:declined``) or OutcomeUnknown (no answer: the
          retry reconciles first).
        - ``reconcile(key)``: looks the key up at the provider when an earlier send's outcome is
          open: an OperationResult (it happened), ``ABSENT`` (it did not: re-sent under the key),
          ``Miss(window_seconds)`` / ``Processing(window_seconds)`` (not settled yet: looked at
          again later) or None (cannot tell: parked for a person). None here: a person decides.
        - ``key``: the operation key, when it must be another than ``operation_key(name)``.
        - ``estimate_minor``: the most the call can cost (minor units), reserved on the budgets that
          cover the job before the call and settled to the actual cost after it.
        - ``amount_minor``, ``currency``, ``target``: what the call moves and to whom, for a
          critical operation's review (the approval is bound to them) and for people reading it.
        - ``tenant``: the budgets' tenant, when not the job input's ``"tenant"``.

        Returns the result's data (stored redacted). Raises Park (waiting for a review, needs
        attention, a budget is spent) for the runtime: the job is set aside without using an attempt.
        """
        self.checkpoint()
        # One span per operation, under the innermost open span: a model call sits at its depth.
        before = dict(self.counted)
        attributes: dict[str, Any] = {"koala.operation.name": name, "koala.operation.kind": kind}
        if target:
            attributes["koala.operation.target"] = target
        with self.spans.open(f"{kind} {name}", attributes) as span:
            result = run_operation(
                self,
                name,
                kind=kind,
                params=params,
                perform=perform,
                reconcile=reconcile,
                key=key,
                estimate_minor=estimate_minor,
                amount_minor=amount_minor,
                currency=currency,
                target=target,
                tenant=tenant,
            )
            # What this operation added to the job (the ledger's count) is the span's usage.
            for field in ("input_tokens", "output_tokens", "cost_minor"):
                added = self.counted.get(field, 0) - before.get(field, 0)
                if added:
                    span.usage[field] = int(added)
            if kind in ("model", "model_call") and target:
                span.usage["model"] = target[:100]
        return result

    def operation_key(self, name: str) -> str:
        """The default key of step ``name``: stable across retries, unique per job and step."""
        return f"{self.idempotency_key}:{name}"

    def previous_operation(self, name: str, *, key: str | None = None) -> Operation | None:
        """The stored ledger row of step ``name`` (any state), e.g. the params of a crashed publish."""
        return Operation.objects.filter(key=key or self.operation_key(name)).first()

    def span(self, name: str, **attributes: Any) -> AbstractContextManager[OpenSpan]:
        """A span of this attempt's trace around a ``with`` block: ``with ctx.span("draft", model=m)
        as span:``. Spans nest by the blocks (on one thread); each ledger operation inside is a span
        under the innermost. ``span.set(**attributes)`` and ``span.add_usage(input_tokens=…,
        output_tokens=…, cost_minor=…, model=…)`` add to it while it runs. Attributes are strings,
        numbers, booleans or lists of them (stored redacted); anything else raises SpanError (a
        ValueError) at once. At most 1000 spans per attempt are kept."""
        return self.spans.open(name, attributes)

    def set_state(self, **delta: Any) -> None:
        """Top-level keys merged into the run's state when the attempt completes."""
        self.state_delta.update(delta)

    def add_usage(self, **amounts: float) -> None:
        """Count usage of the body's own (calls it made outside ``operation``): added to the
        attempt's and the job's usage when the attempt ends. What operations cost is counted by
        the ledger when they settle; adding it here too would count it twice."""
        for key, amount in amounts.items():
            self.usage[key] = self.usage.get(key, 0) + amount

    def count(self, amounts: dict[str, float]) -> None:
        """The ledger's note of what an operation added to the job (for the caller to show)."""
        for key, amount in amounts.items():
            self.counted[key] = self.counted.get(key, 0) + amount

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Attribute the time inside to ``db`` or ``storage`` wait instead of compute."""
        if what not in self.waits:
            raise ValueError("waiting() takes 'db' or 'storage'")
        started = time.monotonic()
        try:
            yield
        finally:
            self.waits[what] += time.monotonic() - started

    # -- runtime side ------------------------------------------------------------
    def take_progress(self) -> dict[str, Any] | None:
        with self._lock:
            pending, self._pending_progress = self._pending_progress, None
        return pending

    def reject(self, rejection: Rejection) -> None:
        self.rejection = rejection
        self.cancelled.set()
