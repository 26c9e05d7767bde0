"""Lease services: claim, heartbeat, the strict fence. The machine loop.

Every write after the claim names the attempt's fencing token: ``UPDATE … WHERE id = … AND
lease_token = <mine> AND state = 'running' AND lease_expires_at > now()`` (``sql.LIVE_LEASE``).
Zero rows means the attempt is stale; ``rejection_for`` then names why, from the
closed set in ``workers.errors.Rejection``. Never check-then-write: the row count
of the conditional write is the decision.

These run once or twice per job, so they are hand-written SQL (one statement, one
commit each) rather than ORM sequences: the engine's whole overhead per job is
enqueue + claim + complete = three commits. The statements are in workers.sql; the fence
predicate they share is ``sql.LIVE_LEASE``, and ``hold_lease`` is the one strict fence for
writes to other tables. How an attempt ends is written by ``workers.transitions.end_attempt``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from koala.redaction import redact_text
from workers import hooks, kinds, sql, transitions
from workers.errors import Rejection
from workers.models import ParkReason, Scope
from workers.services import budgets, pauses
from workers.services.budgets import BudgetExhausted, ClaimBlocked
from workers.transitions import rejection_for


@dataclass(frozen=True)
class Lease:
    job_id: int
    attempt_id: int
    kind: str
    version: int
    queue: str
    input: dict[str, Any]
    run_state: dict[str, Any]
    progress: dict[str, Any]
    lease_token: int
    attempts: int
    max_attempts: int
    delivery: str
    timeout_seconds: float
    deadline_at: datetime | None
    correlation_id: str
    trace_id: str
    idempotency_key: str | None
    created_by: str
    operation_key_base: str  # an operator retry's carried key base ('' for the job's own)
    # A workflow's step (Job.run_id, step, steps): None / "" / {} for a job of its own.
    run_id: int | None = None
    step: str = ""
    steps: dict[str, Any] = field(default_factory=dict)

    @property
    def tenant(self) -> str:
        value = self.input.get("tenant")
        return value if isinstance(value, str) else ""


def _json(value: Any) -> Any:
    # Django registers a jsonb loader that returns text (it decodes in from_db_value).
    return json.loads(value) if isinstance(value, str | bytes) else value


def _lease(row: Sequence[Any]) -> Lease:
    values = list(row)
    for index in (5, 6, 7):  # input, run_state, progress
        values[index] = _json(values[index])
    if len(values) > 21:
        values[21] = _json(values[21])  # steps
    return Lease(*values)


@dataclass(frozen=True)
class HeldLease:
    """Attempt ``lease.attempt_id`` as the HTTP protocol finds it: its lease, who holds it, and
    the outcome already recorded for it (None while it runs)."""

    lease: Lease
    worker_id: str
    outcome: str | None
    started_at: datetime


def lease_of(*, attempt_id: int) -> HeldLease | None:
    """The lease attempt ``attempt_id`` holds or held (a read; the fence is each write's)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.LEASE_OF_ATTEMPT, [attempt_id])
        row = cursor.fetchone()
    if row is None:
        return None
    return HeldLease(lease=_lease(row[:-3]), worker_id=row[-3], outcome=row[-2], started_at=row[-1])


def _claim(statement: str, params: dict[str, Any], *, gated: bool) -> Lease | None:
    """Claim under the gates: live pauses (in the SQL) and budgets (admit_claim, same transaction).

    Raises ClaimBlocked when a concurrency limit is full (the claim is rolled back and the
    job stays queued). A job whose budget is out of attempts or run time is parked. (The attempt's
    run time is added to the same budgets when it ends, by its end's own statement: sql._FINISH.)

    ``gated=False`` (no budget limits concurrency, attempts or run time, as the caller read
    at the start of its pass) claims with the single autocommit statement: one round trip
    instead of four, which is most of a short job's engine cost.
    """
    if not gated:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        return _lease(row) if row else None
    exhausted: BudgetExhausted | None = None
    lease: Lease | None = None
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                row = cursor.fetchone()
            if row is None:
                return None
            lease = _lease(row)
            budgets.admit_claim(job_id=lease.job_id, kind=lease.kind, queue=lease.queue, tenant=lease.tenant)
    except BudgetExhausted as exc:
        exhausted = exc
    if exhausted is not None and lease is not None:
        hooks.count_rejection("budget_exhausted")  # refused at claim: the job parks, unstarted
        park_queued(job_id=lease.job_id, reason=ParkReason.BUDGET, detail=exhausted.detail, parked_on=exhausted.parked_on)
        return None
    return lease


def claim_job(
    *, job_id: int, worker: str, lease_seconds: float, served: Sequence[str] | None = None, gated: bool = True
) -> Lease | None:
    """Claim one specific job (the one an RQ message named), if it is still queued, due, not
    paused, and of a "kind@version" in ``served`` (default: every pair this process registers).

    A duplicate delivery finds it running or finished and gets None: a no-op. So does a
    doorbell for a job this worker does not serve; ``misdelivered`` tells that case apart.
    """
    pairs = [k.key for k in kinds.runnable()] if served is None else list(served)
    try:
        return _claim(sql.CLAIM_JOB, {"job_id": job_id, "served": pairs, "worker": worker, "lease": lease_seconds}, gated=gated)
    except ClaimBlocked:
        return None


@dataclass(frozen=True)
class Misdelivery:
    """A doorbell for a due job this worker does not serve, and who else listens on its queue."""

    queue: str
    version: int
    capable: int  # live workers on the queue that serve the job's kind@version
    incapable: int  # live workers on the queue that do not (this one included, when registered)


def misdelivered(*, job_id: int, served: Sequence[str], live_seconds: float) -> Misdelivery | None:
    """After claim_job got None: is ``job_id`` queued and due but of a pair not in ``served``?

    Counts the live workers (a WorkerProcess row seen within ``live_seconds``, not stopped) on
    the job's queue that do and do not serve it, so the caller can pass the doorbell on to a
    capable worker a bounded number of times. None when the job is not queued and due (taken,
    finished, scheduled later) or when this worker serves it (a pause or budget held it back).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            sql.MISDELIVERED,
            [live_seconds, job_id, list(served)],
        )
        row = cursor.fetchone()
    return Misdelivery(queue=row[0], version=row[1], capable=row[2], incapable=row[3]) if row else None


def claim_next(
    *,
    queue: str,
    served: Sequence[str],
    worker: str,
    lease_seconds: float,
    skip_kinds: Sequence[str] = (),
    gated: bool = True,
    owner: str | None = None,
) -> Lease | None:
    """Claim the next due job in ``queue`` among the served "kind@version" pairs.

    Raises ClaimBlocked when the picked job's concurrency scope is full; the caller skips
    that kind (or the whole queue) for the rest of its pass. ``owner``: an HTTP worker's key
    (``claim_for_worker``), whose row the statement checks and whose concurrency it holds.
    """
    params = {"queue": queue, "served": list(served), "worker": worker, "lease": lease_seconds, "skip": list(skip_kinds)}
    if owner is not None:
        return _claim(sql.CLAIM_NEXT_FOR_HTTP, {**params, "owner": owner, "n": 1}, gated=gated)
    return _claim(sql.CLAIM_NEXT, params, gated=gated)


def claim_next_many(
    *,
    queue: str,
    served: Sequence[str],
    worker: str,
    lease_seconds: float,
    count: int,
    skip_kinds: Sequence[str] = (),
    batchable: bool = False,
    owner: str | None = None,
) -> list[Lease]:
    """Claim up to ``count`` due jobs of ``queue`` in one statement. Only while no budget gates
    claims (``budgets.claims_are_gated()`` is False): pauses are in the SQL, as in claim_next.

    ``batchable``: only jobs that may wait unstarted behind others of the batch (at_least_once
    with an attempt left after this one: ``sql.CLAIM_NEXT_MANY``), for a worker that runs its
    leases one after another rather than at once."""
    params: dict[str, Any] = {
        "queue": queue,
        "served": list(served),
        "worker": worker,
        "lease": lease_seconds,
        "skip": list(skip_kinds),
        "n": count,
    }
    with connection.cursor() as cursor:
        if owner is not None:  # an HTTP worker's (claim_for_worker): never batchable
            cursor.execute(sql.CLAIM_NEXT_FOR_HTTP, {**params, "owner": owner})
        else:
            cursor.execute(sql.CLAIM_NEXT_MANY, {**params, "batchable": batchable})
        rows = cursor.fetchall()
    return [_lease(row) for row in rows]


@dataclass
class ClaimPass:
    """One pass's view of what holds claims back, read once and kept for the pass (an RQ worker's
    batch, an API poller round): whether any budget gates claims, the kinds each queue skips
    (paused kinds, then kinds whose concurrency scope the pass found full), and the queues not to
    claim from at all (``"*"``: a global pause). Both kinds of worker claim through it.

    The claim statement stays the authority on pauses (a pause made meanwhile holds from the next
    claim on); knowing them up front only spares it from walking past a paused kind's backlog on
    every claim (11 -> 5 ms per claim with 20,000 paused jobs at the head of the queue). A budget
    created meanwhile applies from the next pass; spend and requests are reserved per call and
    never depend on this.
    """

    gated: bool
    paused_kinds: list[str] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)
    skip: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def read(cls) -> ClaimPass:
        # A tenant's pause holds some of a kind's or queue's jobs (the claim statement passes over
        # them): skipping the kind or the queue for it would hold every other tenant's jobs too.
        live = pauses.pauses_of_every_tenant()
        blocked = {p.target for p in live if p.scope == Scope.QUEUE}
        if any(p.scope == Scope.GLOBAL for p in live):
            blocked.add("*")
        return cls(
            gated=budgets.claims_are_gated(), paused_kinds=[p.target for p in live if p.scope == Scope.KIND], blocked=blocked
        )

    def holds(self, queue: str) -> bool:
        return "*" in self.blocked or queue in self.blocked

    def skipped(self, queue: str) -> list[str]:
        return self.skip.setdefault(queue, list(self.paused_kinds))

    def full(self, blocked: ClaimBlocked, queue: str) -> None:
        """A concurrency scope is full: skip its kind (or the whole queue) for the rest of the pass;
        whoever frees a slot (or the beat) rings again."""
        if blocked.scope == Scope.KIND:
            self.skipped(queue).append(blocked.target)
        else:
            self.blocked.add(queue)


def claim_from(
    *,
    queues: Sequence[str],
    served: Sequence[str],
    worker: str,
    lease_seconds: float,
    count: int,
    state: ClaimPass,
    batchable: bool = False,
    owner: str | None = None,
) -> list[Lease]:
    """Claim up to ``count`` due jobs ``worker`` serves, queue by queue in order, under the pass's
    pauses and budgets: the one claim loop of an RQ worker's drain and an HTTP worker's acquire.
    ``batchable``: see claim_next_many (applies to the one-statement claim of several jobs).
    ``owner``: an HTTP worker's key; only through ``claim_for_worker``, which holds its row's lock."""
    got: list[Lease] = []
    for queue in queues:
        if state.holds(queue):
            continue
        if not state.gated and count - len(got) > 1:
            # No budget gates claims: the rest of the request in one statement (one commit).
            got += claim_next_many(
                queue=queue,
                served=served,
                worker=worker,
                lease_seconds=lease_seconds,
                count=count - len(got),
                skip_kinds=state.skipped(queue),
                batchable=batchable,
                owner=owner,
            )
        else:
            while len(got) < count and not state.holds(queue):
                try:
                    lease = claim_next(
                        queue=queue,
                        served=served,
                        worker=worker,
                        lease_seconds=lease_seconds,
                        skip_kinds=state.skipped(queue),
                        gated=state.gated,
                        owner=owner,
                    )
                except ClaimBlocked as full:
                    state.full(full, queue)
                    continue
                if lease is None:
                    break
                got.append(lease)
        if len(got) >= count:
            break
    return got


@dataclass(frozen=True)
class WorkerFull:
    """The HTTP worker already holds as many leases as its concurrency (as its row's lock found it)."""

    held: int


@dataclass(frozen=True)
class WorkerRow:
    """An HTTP worker's row as its claim found it, under the lock: what it serves now."""

    concurrency: int
    held: int
    kinds: tuple[str, ...]
    queues: tuple[str, ...]


def claim_for_worker(
    *, worker: str, owner: str, lease_seconds: float, count: int, state: ClaimPass
) -> tuple[WorkerRow | None, list[Lease] | WorkerFull]:
    """Claim up to ``count`` jobs for HTTP worker ``worker`` of key ``owner``, within what its row
    says now: its kinds and queues, not stopped or asked to stop, and its concurrency, which holds
    however many API server processes claim for it at once (the row is locked for the claim's
    transaction and the limit is in the claim statement: ``sql.CLAIM_NEXT_FOR_HTTP``).

    Returns the row as the lock found it (None: no such running row — stopped, asked to stop,
    registered by another key — and nothing claimed) and the leases, or ``WorkerFull`` when it
    holds its concurrency already.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql.LOCK_HTTP_WORKER, {"worker": worker, "owner": owner})
            found = cursor.fetchone()
        if found is None:
            return None, []
        row = WorkerRow(
            concurrency=int(found[0]), held=int(found[1]), kinds=tuple(_json(found[2])), queues=tuple(_json(found[3]))
        )
        if row.held >= row.concurrency:
            return row, WorkerFull(held=row.held)
        return row, claim_from(
            queues=row.queues,
            served=row.kinds,
            worker=worker,
            lease_seconds=lease_seconds,
            count=min(count, row.concurrency - row.held),
            state=state,
            owner=owner,
        )


def park_queued(*, job_id: int, reason: str, detail: str, parked_on: dict[str, Any] | None = None) -> bool:
    """Park a queued job that was never started (a budget refused it at claim time)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            sql.PARK_QUEUED,
            [reason, redact_text(detail), json.dumps(parked_on or {}), job_id],
        )
        rows = cursor.fetchall()
        transitions.reached(transitions.transitions_of(rows, outcome=None, cause="budget"))
    return bool(rows)


def hold_lease(*, job_id: int, lease_token: int) -> Rejection | None:
    """Lock attempt ``lease_token``'s job row for the rest of the current transaction.

    Every attempt-side write to a table other than ``workers_job`` (ledger, export records,
    budgets reserved for a call) calls this first, inside the same transaction; None means the
    lease is live and stays ours until COMMIT. A stalled transaction cannot keep it for long:
    worker sessions end idle transactions (workers/dbsession.py). Why a row lock and not an
    ``EXISTS``: see ``sql.HOLD_LEASE``.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("hold_lease() must run inside transaction.atomic(): the lock lasts until COMMIT")
    with connection.cursor() as cursor:
        cursor.execute(sql.HOLD_LEASE, {"job_id": job_id, "lease_token": lease_token})
        if cursor.fetchone() is not None:
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token)


def heartbeat(*, job_id: int, lease_token: int, lease_seconds: float, progress: dict[str, Any] | None = None) -> Rejection | None:
    """Extend the lease and store a progress checkpoint. None means the lease is still ours."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.HEARTBEAT,
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "lease_seconds": lease_seconds,
                "progress": json.dumps(progress) if progress is not None else None,
            },
        )
        if cursor.fetchone():
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token)


def heartbeat_many(*, held: Sequence[Lease], lease_seconds: float) -> set[int]:
    """Extend the leases in ``held`` (one statement, each row fenced by its own token): the jobs
    an RQ worker's batch holds while they wait their turn or their batch's completion. Returns the
    job ids still held; a lease missing from it was lost (the reaper or an operator took the job)."""
    if not held:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            sql.HEARTBEAT_MANY,
            {
                "job_ids": [lease.job_id for lease in held],
                "tokens": [lease.lease_token for lease in held],
                "lease_seconds": lease_seconds,
            },
        )
        return {int(row[0]) for row in cursor.fetchall()}
