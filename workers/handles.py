"""What ``@job_kind`` and ``remote_kind`` return: a handle on the kind (``from workers import job_kind``).

    @job_kind("billing.send_invoice", version=2, queue="billing", required_fields={"invoice"})
    def send_invoice(ctx, data): ...

    created = send_invoice.enqueue({"invoice": 7}, key="invoice-7")   # an EnqueueResult
    send_invoice.enqueue_many([{"invoice": 8}, send_invoice.spec({"invoice": 9}, key="invoice-9")])
    send_invoice.kind                                                # the JobKind: its policy

A handle enqueues its own name and version, so a caller names the kind by the object it
imported, never by a string it could mistype. Calling the handle calls the body
(``send_invoice(ctx, data)``), as a test does.

When the job is stored: outside a transaction, ``enqueue`` returns once the job is committed
(and a worker is rung right away); inside the caller's ``transaction.atomic()``, the job is part
of the caller's transaction: it exists for others when that transaction commits, the doorbell
rings then (``transaction.on_commit``), and a rollback leaves no job and no ring.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

from workers import kinds
from workers.errors import EnqueueError
from workers.kinds import Body, JobKind, KindPolicy
from workers.services import jobs
from workers.services.jobs import EnqueueResult, JobSpec

if TYPE_CHECKING:
    from workers.context import JobContext


class KindHandle:
    """One registered kind (``name@version``): its policy (``kind``), its body, and how to enqueue it."""

    def __init__(self, kind: JobKind) -> None:
        self.kind = kind
        if not kind.remote:
            # The body's name, docstring and module, so the handle reads like the function it wraps.
            functools.update_wrapper(self, kind.body)

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def version(self) -> int:
        return self.kind.version

    @property
    def key(self) -> str:
        """``name@version``, as records and logs show the kind."""
        return self.kind.key

    def __call__(self, ctx: JobContext, data: dict[str, Any]) -> Any:
        """Run the body (a remote kind has none here: it raises RuntimeError)."""
        return self.kind.body(ctx, data)

    def __repr__(self) -> str:
        return f"<KindHandle {self.kind.key}{' (remote)' if self.kind.remote else ''}>"

    def spec(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        delay_seconds: float = 0.0,
        correlation_id: str = "",
    ) -> JobSpec:
        """One job of this kind and version, for ``enqueue_many`` (this handle's or the root's, which
        mixes kinds). ``key`` is the job's idempotency key; ``queue`` overrides the kind's."""
        return JobSpec(
            kind=self.kind.name,
            input=input if input is not None else {},
            idempotency_key=key,
            version=self.kind.version,
            queue=queue,
            priority=priority,
            delay_seconds=delay_seconds,
            correlation_id=correlation_id,
        )

    def enqueue(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        delay_seconds: float = 0.0,
        correlation_id: str = "",
        created_by: str = "",
    ) -> EnqueueResult:
        """Store one job of this kind and version; return its id and whether it is new.

        ``key``: the idempotency key: the same key with the same input returns the earlier job
        (``created`` False), with other input raises EnqueueError and stores nothing. The input is
        checked first (required fields, the kind's ``validate``, size, JSON): EnqueueError says
        what is wrong. ``delay_seconds``: due that much later; ``priority``: higher runs first;
        ``created_by``: the person on whose behalf it is enqueued (an audit row, same transaction).

        Outside a transaction the job is committed when this returns; inside the caller's
        ``transaction.atomic()`` it commits (and the doorbell rings) with the caller's transaction.
        """
        spec = self.spec(
            input, key=key, queue=queue, priority=priority, delay_seconds=delay_seconds, correlation_id=correlation_id
        )
        return jobs.enqueue_many(specs=[spec], created_by=created_by)[0]

    def enqueue_many(self, items: Iterable[Mapping[str, Any] | JobSpec], *, created_by: str = "") -> list[EnqueueResult]:
        """Store several jobs of this kind in one transaction (all or none); results in the items' order.

        An item is an input (a mapping) or a ``spec(…)`` of this handle for a key, a delay or a
        priority of its own. Committed when this returns, or with the caller's transaction, as
        ``enqueue``.
        """
        specs = [self._own(item) for item in items]
        return jobs.enqueue_many(specs=specs, created_by=created_by)

    def _own(self, item: Mapping[str, Any] | JobSpec) -> JobSpec:
        if not isinstance(item, JobSpec):
            return self.spec(item)
        if item.kind != self.kind.name or item.version not in (None, self.kind.version):
            named = item.kind if item.version is None else f"{item.kind}@{item.version}"
            raise EnqueueError(f"{self.kind.key}.enqueue_many() takes inputs or specs of {self.kind.key}, not of {named}.")
        if item.version is None:
            return dataclasses.replace(item, version=self.kind.version)
        return item


def job_kind(name: str, *, version: int = 1, **policy: Unpack[KindPolicy]) -> Callable[[Body], KindHandle]:
    """Declare the kind ``name@version`` whose body is the decorated function; returns its handle.

    The policy (each optional; JobKind has the defaults): ``queue``, ``delivery``
    (``Delivery.AT_LEAST_ONCE`` or ``AT_MOST_ONCE``, which needs ``max_attempts=1``),
    ``max_attempts``, ``timeout_seconds`` (one attempt), ``deadline_seconds`` (from enqueue),
    ``backoff_base`` / ``backoff_cap`` (full-jitter retry delay), ``sensitive_fields`` (masked
    everywhere, docs/redaction.md), ``required_fields``, ``validate`` (raises ValueError or
    TypeError on bad input, at enqueue), ``max_input_bytes`` (the most the input may hold, in UTF-8
    bytes of its JSON; 16 KiB by default), ``critical`` (operation name → ``"always"``,
    ``{"above_minor": N}`` or a callable: needs a reviewer's approval), ``retry_instead``, and
    ``memory_limit_mb`` / ``cpu_limit_seconds`` (one attempt's ceilings in the fork class's work
    horse, over KOALA_ATTEMPT_MEMORY_LIMIT_MB / KOALA_ATTEMPT_CPU_LIMIT_SECONDS; workers/bounds.py).
    A policy the engine cannot honour raises ValueError here, at import.
    """

    def decorate(body: Body) -> KindHandle:
        return KindHandle(kinds.declare(name, version, body, policy))

    return decorate


def remote_kind(name: str, *, version: int = 1, **policy: Unpack[KindPolicy]) -> KindHandle:
    """Declare a kind whose bodies run in workers over HTTP (docs/worker-api.md): its contract,
    without a body here; RQ workers never claim it. Its handle enqueues like any other.

        send_invoice = remote_kind("billing.send_invoice", version=2, queue="billing",
                                   sensitive_fields={"iban"}, critical={"charge": {"above_minor": 10_000}})
    """
    return KindHandle(kinds.declare_remote(name, version, policy))
