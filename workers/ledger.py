"""The operations ledger: each outbound side effect is a row committed *before* the call.

    data = ctx.operation("charge", kind="charge", params={...},
                         perform=lambda key: client.charge(..., idempotency_key=key),
                         reconcile=lambda key: client.lookup(key))

The row's key is stable across retries of the step and goes to the provider as its
idempotency key. What a re-run finds decides what happens:

- ``succeeded`` / ``reconciled``: the stored result is returned; nothing is sent.
- ``in_flight`` / ``uncertain`` (a crash or a timeout left the outcome open): the
  kind's ``reconcile(key)`` looks it up at the provider. Found: settled as
  ``reconciled``. Proven absent: re-sent with the same key. Not settled yet (the
  provider is still processing, its lookup missed inside its processing window, the
  lookup failed): the job is released without using an attempt and asks again later,
  for at most ``KOALA_RECONCILE_MAX_WAIT_SECONDS`` past the window. Cannot tell, or the
  wait ran out: the job is parked *needs attention* for a person; nothing is re-sent.
- ``failed`` (it definitely did not happen): re-sent with the same key.

Every write names the attempt's fencing token, so a stale attempt cannot record an
operation. Budget reservations and review approvals are taken in the same transaction
that marks the row ``in_flight``, so the three never disagree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction

from koala import redaction, storable
from workers import hooks, sql, transitions
from workers.errors import (
    Declined,
    NotPerformed,
    OperationMismatch,
    OutcomeUnknown,
    Park,
    ReconcileLater,
    Retryable,
    StaleAttempt,
    TerminalFailure,
)
from workers.models import Budget, Operation, OperationState, ParkReason, Resolution
from workers.services import budgets
from workers.services.budgets import BudgetExhausted

if TYPE_CHECKING:
    from workers.context import JobContext

log = logging.getLogger("koala.operations")


@dataclass(frozen=True)
class OperationResult:
    """What a perform() or a successful reconcile() returns."""

    external_id: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # handed to the body (stored redacted for re-runs)
    cost_minor: int | None = None  # actual cost; None = price ``usage`` from ModelPrice, else the estimate
    usage: dict[str, Any] | None = None  # e.g. {"model": "m", "input_tokens": 10, "output_tokens": 5}
    summary: dict[str, Any] | None = None  # what to keep of the provider's answer (default: data), redacted


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()  # reconcile(): the provider has no record of this key; it is safe to re-send


@dataclass(frozen=True)
class Miss:
    """reconcile(): the provider's lookup has no record of this key *now*.

    Proof of absence only under the provider's contract: once the last send under the key is
    older than ``window_seconds``, the provider's declared processing window (the longest a
    request it received can take to show in a lookup). Inside the window the outcome is open.
    """

    window_seconds: float


@dataclass(frozen=True)
class Processing:
    """reconcile(): the provider has the request under this key and has not finished it (or it
    refused the lookup as "key in use"): the outcome is open. ``window_seconds`` as in Miss."""

    window_seconds: float


# What reconcile(key) answers: it happened (the result), it did not (ABSENT), not settled yet
# (Miss, Processing: weighed against the provider's window), or None: nobody can tell.
ReconcileAnswer = OperationResult | _Absent | Miss | Processing | None
Perform = Callable[[str], OperationResult]
Reconcile = Callable[[str], ReconcileAnswer]
_CURRENCY = re.compile(r"[A-Z]{3}")
RECONCILE_MIN_DELAY = 1.0  # seconds between two looks at one open outcome, at least …
RECONCILE_MAX_DELAY = 60.0  # … and at most (the delay grows with the time the outcome has been open)


def _is_reconcile_answer(answer: object) -> bool:
    """Whether ``answer`` is one of the answers reconcile() may give (ReconcileAnswer)."""
    return answer is None or answer is ABSENT or isinstance(answer, OperationResult | Miss | Processing)


def fingerprint(params: dict[str, Any]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class _NeedsReview(Exception):
    """No usable approval: roll the send transaction back, then ask for one."""


class _Ledger:
    """One call of ctx.operation: the state machine above, for one step of one attempt."""

    def __init__(
        self,
        ctx: JobContext,
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
    ) -> None:
        if not name:
            raise ValueError("an operation needs a name")
        if estimate_minor < 0:
            raise ValueError("estimate_minor cannot be negative")
        if currency and not _CURRENCY.fullmatch(currency):
            raise ValueError(f"currency must be a 3-letter code in capitals (ISO 4217), not {currency[:10]!r}")
        self.ctx = ctx
        self.name = name
        self.kind = kind
        self.params = params
        self.perform = perform
        self.reconcile = reconcile
        self.key = key or ctx.operation_key(name)
        self.fingerprint = fingerprint(params)
        self.estimate = estimate_minor
        self.amount = amount_minor
        # The currency of the amount: the step's own (a charge in the order's currency), else the
        # one every cost is in. Stored on the row, so pages show the amount in it whatever the
        # step's parameters hold (a kind of one's own need not name a currency there).
        self.currency = currency or settings.KOALA_COST_CURRENCY
        self.target = target
        self.tenant = tenant if tenant is not None else ctx.lease.tenant
        # The attempt's redaction context plus the step's own sensitive parameters.
        self.redactor = ctx.redactor.learn(params)
        self.fence = {"job": ctx.job_id, "token": ctx.lease.lease_token}

    # -- helpers --------------------------------------------------------------------------
    def _redact(self, data: Any) -> Any:
        return self.redactor.data(data)

    def _text(self, text: str) -> str:
        return self.redactor.text(text)

    def _load(self) -> Operation | None:
        return Operation.objects.filter(key=self.key).first()

    def _update(self, op_id: int, statement: str, values: dict[str, Any], *, own: bool = True) -> None:
        """A fenced UPDATE of the operation row (one of sql.OPERATION_*); a stale attempt gets
        StaleAttempt and writes nothing. ``own``: only while this attempt is the row's holder."""
        with transaction.atomic():
            self.ctx.hold_lease()
            with connection.cursor() as cursor:
                cursor.execute(statement, {**values, **self.fence, "op": op_id, "any_holder": not own})
                if cursor.rowcount != 1:
                    # Our lease is live (we hold it), so the row itself moved on: another job
                    # holding the same key, or a person's resolution. Never overwrite it.
                    raise Retryable("operation row changed concurrently; retrying to reconcile", retry_after=1)

    # -- the state machine ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        op = self._load()
        if op is not None:
            if op.fingerprint != self.fingerprint:
                raise OperationMismatch(
                    f"operation key {self.key!r} was already used for {op.kind} with other parameters; "
                    "refusing to send a different request under it"
                )
            if op.is_done:
                return dict(op.result or {})
            if op.state in (OperationState.IN_FLIGHT, OperationState.UNCERTAIN):
                settled = self._reconcile(op)
                if settled is not None:
                    return settled
                op.refresh_from_db()
        return self._send(op)

    def _reconcile(self, op: Operation) -> dict[str, Any] | None:
        """Settle an open outcome by asking the provider. Returns the result if it happened.

        Never records "did not happen" for what may have happened: only ``ABSENT``, or a ``Miss``
        older than the provider's processing window, is proof of absence. Anything else that
        leaves the outcome open keeps the row open (reservation held) and either waits (released,
        no attempt used) or, past the bound or with no way to tell, parks for a person.
        """
        answer: OperationResult | _Absent | Miss | Processing | None = None
        failure = ""  # the lookup itself failed transiently (timeout, 5xx, 429, refused)
        retry_after: float | None = None
        if self.reconcile is not None:
            try:
                answer = self.reconcile(self.key)
            except (OutcomeUnknown, NotPerformed, Retryable) as exc:
                # Ask again later rather than hand a person a question the provider will answer in
                # a minute; and never as a Retryable, which would spend the job's attempts on it.
                failure = self._text(str(exc))
                retry_after = getattr(exc, "retry_after", None)
            except Exception as exc:  # the lookup failed in a way retrying will not fix: we cannot tell
                log.warning("operation %s: reconcile failed: %s", op.pk, type(exc).__name__)
                answer = None
            else:
                if not _is_reconcile_answer(answer):
                    # A bug in the kind's code (a raw provider answer handed back, say), refused at once
                    # as perform()'s answer is (_call). Not a fatal failure: the outcome is still open
                    # (the call may have happened), so nothing may be re-sent, and a failed job would
                    # end holding its reservation off every person's list. Not a look again later: the
                    # same code gives the same answer, for KOALA_RECONCILE_MAX_WAIT_SECONDS. A person
                    # settles it from the needs-attention page; the re-run then never asks reconcile.
                    wrong = TypeError(
                        f"reconcile() for {self.name!r} returned {type(answer).__name__}, not an OperationResult, "
                        "ABSENT, Miss, Processing or None"
                    )
                    log.error("operation %s: %s (a bug in the kind %s)", op.pk, wrong, self.ctx.kind.key)
                    raise self._ask_a_person(
                        op, f"{wrong}: a bug in the kind's code; check the provider, then fix the kind"
                    ) from None
        if isinstance(answer, OperationResult):
            return self._settle_success(op, answer, state=OperationState.RECONCILED, resolution=Resolution.FOUND, own=False)
        if self.reconcile is None or (answer is None and not failure):
            # No lookup, or one that cannot confirm or deny: a person must decide. Nothing is re-sent.
            raise self._ask_a_person(op, "the provider cannot confirm or deny this key")
        elapsed = self._since_last_send(op)
        if answer is ABSENT or (isinstance(answer, Miss) and elapsed > answer.window_seconds):
            self._proven_absent(op, elapsed)
            return None
        window = answer.window_seconds if isinstance(answer, Miss | Processing) else 0.0
        if isinstance(answer, Miss):
            why = (
                f"the provider has no record of this key yet, {elapsed:.1f}s after the last send "
                f"(within its processing window of {window:g}s)"
            )
        elif isinstance(answer, Processing):
            why = f"the provider is still processing this key ({elapsed:.1f}s after the last send)"
        else:
            why = f"the lookup failed ({failure})"
        bound = window + float(settings.KOALA_RECONCILE_MAX_WAIT_SECONDS)
        if elapsed >= bound:
            raise self._ask_a_person(op, f"{why}; still open after {elapsed:.0f}s (waited up to {bound:g}s)")
        # Back off with the time the outcome has been open (so the number of looks is about
        # log(bound) + bound/60), never past the next point where the answer can change: the end
        # of the window (a miss becomes proof) or of the bound (a person is asked).
        delay = min(max(RECONCILE_MIN_DELAY, elapsed / 4), RECONCILE_MAX_DELAY)
        if isinstance(answer, Miss):
            delay = min(delay, window - elapsed + 0.5)
        delay = max(min(delay, bound - elapsed + 0.5), 0.5, retry_after or 0.0)
        message = f"outcome open: {why}; looking again in {delay:.1f}s"
        if op.state == OperationState.IN_FLIGHT:
            # Left in flight by a crash: say it is open. One write, not one per look: the row's
            # own timestamps are not the clock the window is measured on (_since_last_send).
            self._update(op.pk, sql.OPERATION_UNCERTAIN, {"msg": message}, own=False)
        raise ReconcileLater(
            self._text(f"{self.kind} {self.name!r} (key {self.key}): {message}"),
            delay_seconds=delay,
            parked_on={"operation_id": op.pk},
        )

    def _since_last_send(self, op: Operation) -> float:
        """Seconds (database clock) since the last moment the last send under this key can have left.

        That is when the attempt that marked the row in flight stopped holding its lease: it
        reported (after its call returned or timed out), or the reaper or an operator took the job
        from it. A fenced attempt cannot call ``perform`` after that, so the request left no later.
        Taken from the attempt, not from the operation row, so looking again (which writes the row)
        never moves the clock. An attempt still unfinished counts as "now" (nothing is proven yet);
        without an attempt row (deleted), the row's last write stands in.
        """
        with connection.cursor() as cursor:
            cursor.execute(sql.SECONDS_SINCE_LAST_SEND, [op.pk])
            row = cursor.fetchone()
        return max(float(row[0]), 0.0) if row and row[0] is not None else 0.0

    def _proven_absent(self, op: Operation, elapsed: float) -> None:
        """The call never took effect (under the provider's contract). Release what it held; _send re-sends."""
        lease = self.ctx.lease
        exhausted = self.ctx.attempt >= lease.max_attempts and op.attempts >= lease.max_attempts
        note = "re-sending" if not exhausted else "not re-sent: no attempts left"
        with transaction.atomic():
            self._update(
                op.pk,
                sql.OPERATION_PROVEN_ABSENT,
                {"msg": f"reconciled: the provider has no record of this key {elapsed:.0f}s after the last send; {note}"},
                own=False,
            )
            budgets.release(reservations=op.reservations, refund_request=True)
        if exhausted:
            # The last attempt re-sending, time after time, what a provider keeps losing (each
            # send times out, each lookup then proves it absent) would never end: it was sent as
            # often as the job may try. The row says truthfully that it did not happen.
            raise Retryable(self._text(f"{self.kind} {self.name}: sent {op.attempts} times and proven absent each time"))

    def _ask_a_person(self, op: Operation, why: str) -> Park:
        self._update(
            op.pk,
            sql.OPERATION_UNCERTAIN,
            {"msg": self._text(f"could not reconcile: {why}; needs attention")},
            own=False,
        )
        return Park(
            ParkReason.NEEDS_ATTENTION,
            self._text(
                f"operation {op.name!r} ({op.kind}, key {self.key}) has an unknown outcome and could not be reconciled "
                f"({why}); resolve it as happened or did not happen"
            ),
            {"operation_id": op.pk},
        )

    def _budget_binding(self) -> list[dict[str, Any]]:
        rows = budgets.applicable(kind=self.ctx.lease.kind, queue=self.ctx.lease.queue, tenant=self.tenant)
        return [
            {"name": b.name, "spend_limit_minor": b.spend_limit_minor, "request_limit": b.request_limit, "currency": b.currency}
            for b in rows
        ]

    def _binding(self) -> tuple[str, list[dict[str, Any]]] | None:
        """For a critical operation: the digest an approval must match, and the budget limits in it."""
        kind = self.ctx.kind
        if not kind.is_critical(self.name, self.params, self.amount):
            return None
        budget_limits = self._budget_binding()
        binding = {
            "action": self.kind,
            "operation": self.name,
            "key": self.key,
            "fingerprint": self.fingerprint,
            "amount_minor": self.amount,
            "currency": self.currency,
            "target": self.target,
            "kind": kind.key,
            "budgets": budget_limits,
        }
        return hooks.review_gate().digest(binding), budget_limits

    def _request_review(self, digest: str, budget_limits: list[dict[str, Any]]) -> Park:
        snapshot = []
        for limits in budget_limits:
            budget = Budget.objects.get(name=limits["name"])
            usage = budgets.usage_for(budget=budget)
            snapshot.append({**limits, "spent_minor_today": usage.spent_minor, "reserved_minor": usage.reserved_minor})
        summary = {
            "action": self.kind,
            "operation": self.name,
            "params": self._redact(self.params),
            "amount_minor": self.amount,
            "currency": self.currency,
            "target": self._text(self.target),
            "kind": self.ctx.kind.key,
            "budgets": snapshot,
        }
        review_id = hooks.review_gate().request_review(
            job_id=self.ctx.job_id,
            operation_name=self.name,
            operation_key=self.key,
            action=self.kind,
            digest=digest,
            summary=summary,
            amount_minor=self.amount,
            currency=self.currency,
            target=self._text(self.target),
            kind_version=self.ctx.kind.key,
            requested_by=self.ctx.created_by,
        )
        return Park(
            ParkReason.WAITING_REVIEW,
            f"critical {self.kind} {self.name!r} waits for review {review_id}",
            {"review_id": review_id},
        )

    def _send(self, op: Operation | None) -> dict[str, Any]:
        gate = self._binding()
        # Everything that must agree is one transaction: the approval is used, the budget is
        # reserved and the row says in_flight, or none of it happened.
        try:
            with transaction.atomic():
                # First statement: lock our job row, so no reclaim can happen until COMMIT and a
                # stale attempt uses no approval, reserves no budget and records nothing.
                self.ctx.hold_lease()
                if gate is not None and not hooks.review_gate().consume_approval(
                    job_id=self.ctx.job_id, operation_key=self.key, digest=gate[0]
                ):
                    raise _NeedsReview
                reservations = budgets.reserve(
                    kind=self.ctx.lease.kind, queue=self.ctx.lease.queue, tenant=self.tenant, estimate_minor=self.estimate
                )
                op_id = self._mark_in_flight(op, reservations)
        except _NeedsReview:
            assert gate is not None
            raise self._request_review(*gate) from None
        except BudgetExhausted as exc:
            self._on_exhausted(exc)
            hooks.count_rejection("budget_exhausted")
            raise Park(ParkReason.BUDGET, exc.detail, exc.parked_on) from None
        # Re-check (and renew) the lease between the in-flight COMMIT and the call: the commit's
        # reply may have arrived late (a stall, a partition that healed), after the job was
        # reclaimed. A stale attempt stops here; the row it left in_flight is reconciled by the
        # attempt that owns the job now. Renewing gives the call a full lease of time.
        self.ctx.confirm_lease()
        return self._call(op_id, reservations)

    def _on_exhausted(self, exc: BudgetExhausted) -> None:
        budget = Budget.objects.filter(pk=exc.budget_id).first()
        if budget is not None and budget.pause_on_exhaust:
            budgets.pause_scope(budget=budget, reason=f"budget {budget.name!r} exhausted: {exc.detail}")

    def _mark_in_flight(self, op: Operation | None, reservations: list[list[int]]) -> int:
        """Record the call as in flight; the caller's transaction already holds the lease (ctx.hold_lease)."""
        values = {
            **self.fence,
            "attempt": self.ctx.attempt_id,
            "name": self.name,
            "key": self.key,
            "kind": self.kind,
            "fp": self.fingerprint,
            "params": json.dumps(self._redact(self.params), default=str),
            "amount": self.amount,
            "currency": self.currency,
            "target": self._text(self.target)[:200],
            "est": self.estimate,
            "res": json.dumps(reservations),
        }
        with connection.cursor() as cursor:
            if op is None:
                cursor.execute(sql.INSERT_OPERATION, values)
                row = cursor.fetchone()
                if row is None:
                    # We hold our job's lease, so the row is another job's with the same key (a
                    # duplicate job): never send twice; let the retry find and reconcile it.
                    raise Retryable("operation row written concurrently; retrying to reconcile", retry_after=1)
                return int(row[0])
            cursor.execute(sql.RESEND_OPERATION, {**values, "op": op.pk})
            if cursor.rowcount != 1:
                raise Retryable("operation row changed concurrently; retrying to reconcile", retry_after=1)
            return op.pk

    def _call(self, op_id: int, reservations: list[list[int]]) -> dict[str, Any]:
        try:
            outcome = self.perform(self.key)
        except NotPerformed as exc:
            self._settle_not_done(op_id, reservations, f"not performed: {exc}")
            raise Retryable(self._text(f"{self.kind} {self.name}: {exc}"), retry_after=exc.retry_after) from None
        except Declined as exc:
            self._settle_not_done(op_id, reservations, f"declined: {exc}")
            raise TerminalFailure(self._text(f"{self.kind} {self.name} declined: {exc}"), code="declined") from None
        except OutcomeUnknown as exc:
            # Includes "key in use" (409): another request under this key is being processed.
            self._mark_uncertain(op_id, f"outcome unknown: {exc}")
            message = self._text(f"{self.kind} {self.name}: outcome unknown ({exc}); will reconcile")
            if self.ctx.attempt < self.ctx.lease.max_attempts:
                raise Retryable(message) from None
            # The last attempt: as a Retryable the job would end attempts_exhausted while the
            # effect may have happened. Give the attempt back and reconcile (which is bounded).
            raise ReconcileLater(message, delay_seconds=RECONCILE_MIN_DELAY, parked_on={"operation_id": op_id}) from None
        except Exception as exc:
            # An unclassified error after the request may have left: treat the outcome as unknown.
            self._mark_uncertain(op_id, f"{type(exc).__name__}: {exc}")
            raise
        if not isinstance(outcome, OperationResult):
            raise TypeError(f"perform() for {self.name!r} must return an OperationResult, not {type(outcome).__name__}")
        op = Operation.objects.get(pk=op_id)
        return self._settle_success(op, outcome, state=OperationState.SUCCEEDED, resolution=Resolution.NONE, own=True)

    def _settle_success(
        self, op: Operation, outcome: OperationResult, *, state: str, resolution: str, own: bool
    ) -> dict[str, Any]:
        # The call has happened: its answer is kept whatever it holds. What jsonb refuses (a NaN,
        # a NUL: Python's json reads both from a provider) is written out, never left to fail the
        # settlement after the effect; usage counts only its finite numbers.
        outcome = replace(
            outcome,
            data=storable.written_out(outcome.data),
            summary=storable.written_out(outcome.summary) if outcome.summary is not None else None,
            usage={k: v for k, v in (outcome.usage or {}).items() if not (isinstance(v, float) and not math.isfinite(v))}
            if outcome.usage is not None
            else None,
            external_id=storable.written_out(str(outcome.external_id)),
        )
        cost = outcome.cost_minor
        if cost is None:
            cost = budgets.price_usage(outcome.usage)
        if cost is None:
            cost = op.estimate_minor
        # The estimate was reserved as the call's upper bound (what the budget's cap was checked
        # against). A provider that billed more broke that bound: say so on the row, never hide it.
        overshoot = max(cost - op.estimate_minor, 0)
        result = self._redact(outcome.data)
        summary = self._redact(outcome.summary if outcome.summary is not None else outcome.data)
        with transaction.atomic():
            self._update(
                op.pk,
                sql.OPERATION_SUCCEEDED,
                {
                    "state": state,
                    "resolution": resolution,
                    "ext": str(outcome.external_id)[:200],
                    "resp": json.dumps(summary, default=str),
                    "result": json.dumps(result, default=str),
                    "cost": cost,
                    "over": overshoot,
                    "usage": json.dumps(self._redact(outcome.usage or {}), default=str),
                },
                own=own,
            )
            # What the call cost is on the job (and on this attempt's row) from this commit on,
            # whichever kind of worker made it and whether or not the attempt ever reports.
            counted = {**transitions.countable(outcome.usage), "cost_minor": cost}
            with connection.cursor() as cursor:
                cursor.execute(
                    sql.ADD_OPERATION_USAGE,
                    {"usage": json.dumps(counted), "job_id": self.ctx.job_id, "lease_token": self.ctx.lease.lease_token},
                )
            overshot = budgets.settle(reservations=op.reservations, actual_minor=cost)
            if overshot:
                # In this transaction: the spend, the record and the pause commit together, so a
                # crash right after settling cannot leave a broken cap unpaused.
                budgets.pause_overshot(
                    overshoots=overshot, operation=f"operation {op.pk} ({op.kind} {op.name!r} of job {op.job_id})"
                )
        if overshoot:
            log.warning("operation %s: billed %s, %s above its reservation of %s", op.pk, cost, overshoot, op.estimate_minor)
        self.ctx.count(counted)
        # The body gets what a re-run would get: the stored (redacted) result.
        return dict(result)

    def _settle_not_done(self, op_id: int, reservations: list[list[int]], message: str) -> None:
        with transaction.atomic():
            self._update(op_id, sql.OPERATION_NOT_DONE, {"msg": self._text(message)})
            budgets.release(reservations=reservations, refund_request=False)

    def _mark_uncertain(self, op_id: int, message: str) -> None:
        # The reservation stays held: if the call did happen its cost is real.
        try:
            self._update(op_id, sql.OPERATION_UNCERTAIN, {"msg": self._text(message)})
        except StaleAttempt:
            pass  # a newer attempt owns the job; it will reconcile this row


def run_operation(ctx: JobContext, name: str, **options: Any) -> dict[str, Any]:
    ledger = _Ledger(ctx, name, **options)
    # perform()/reconcile() log and raise with the step's parameters in hand: mask those too.
    with redaction.bind(ledger.redactor):
        return ledger.run()


def settle_call(ctx: JobContext, *, operation: Operation, perform: Perform) -> dict[str, Any]:
    """Finish a call whose request was made elsewhere: an HTTP worker began the step with
    ``run_operation`` (its perform handed off once the row was in flight), called the provider
    itself and reported what came back; ``perform`` returns or raises that answer. From here on it
    is the same code path as a local call: settled, budget spent or released, the row's state."""
    ledger = _Ledger(
        ctx,
        operation.name,
        kind=operation.kind,
        params=dict(operation.params or {}),
        perform=perform,
        key=operation.key,
        estimate_minor=operation.estimate_minor,
        amount_minor=operation.amount_minor,
        currency=operation.currency,
        target=operation.target,
    )
    with redaction.bind(ledger.redactor):
        return ledger._call(operation.pk, [list(r) for r in operation.reservations or []])
