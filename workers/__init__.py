"""Koala's public API for writing job kinds and enqueueing them: ``from workers import job_kind, …``.

    from workers import ABSENT, OperationResult, Retryable, job_kind

    @job_kind("billing.send_invoice", queue="default", max_attempts=5, required_fields={"invoice"})
    def send_invoice(ctx, data):
        return ctx.operation("send", kind="email", params=data, perform=..., reconcile=...)

    send_invoice.enqueue({"invoice": 7}, key="invoice-7")

``__all__`` is the whole surface, each name documented in docs/engine.md ("Writing a job kind")
and held to an explicit list by tests/unit/test_public_api.py. The engine's modules behind it
(``workers.kinds``, ``workers.context``, ``workers.ledger``, ``workers.errors``,
``workers.services…``) are the engine's own; what a kind's author imported from them before
still works (the old decorators ``workers.kinds.job_kind`` and ``remote_kind`` warn and go in
the next release).

Importing this package imports nothing else: each name is loaded on first use (PEP 562). Django
imports it while it reads INSTALLED_APPS, before any model may load, and so may a settings module
or a tool that never sets Django up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name -> (the module it lives in, its name there).
_HOMES: dict[str, tuple[str, str]] = {
    # declaring a kind, and its handle
    "job_kind": ("workers.handles", "job_kind"),
    "remote_kind": ("workers.handles", "remote_kind"),
    "KindHandle": ("workers.handles", "KindHandle"),
    "JobKind": ("workers.kinds", "JobKind"),
    "Delivery": ("workers.models", "Delivery"),
    # what a body gets, and the ledger's vocabulary (ctx.operation)
    "JobContext": ("workers.context", "JobContext"),
    "OperationResult": ("workers.ledger", "OperationResult"),
    "ABSENT": ("workers.ledger", "ABSENT"),
    "Miss": ("workers.ledger", "Miss"),
    "Processing": ("workers.ledger", "Processing"),
    "ReconcileAnswer": ("workers.ledger", "ReconcileAnswer"),
    # what a body raises (the SDK's names beside the engine's), and what perform() raises
    "Retryable": ("workers.errors", "Retryable"),
    "RetryableError": ("workers.errors", "RetryableError"),
    "TerminalFailure": ("workers.errors", "TerminalFailure"),
    "StepFailure": ("workers.errors", "StepFailure"),
    "NotPerformed": ("workers.errors", "NotPerformed"),
    "Declined": ("workers.errors", "Declined"),
    "OutcomeUnknown": ("workers.errors", "OutcomeUnknown"),
    # enqueueing by name (a kind's handle is the usual way), and its answers
    "enqueue": ("workers.services.jobs", "enqueue"),
    "enqueue_many": ("workers.services.jobs", "enqueue_many"),
    "JobSpec": ("workers.services.jobs", "JobSpec"),
    "EnqueueResult": ("workers.services.jobs", "EnqueueResult"),
    "EnqueueError": ("workers.errors", "EnqueueError"),
    # pricing a call for its budget reservation (estimate_minor)
    "model_price": ("workers.services.budgets", "model_price"),
    "price_tokens": ("workers.services.budgets", "price_tokens"),
    "applicable_budgets": ("workers.services.budgets", "applicable"),
    "ModelPrice": ("workers.models", "ModelPrice"),
    # workflows: a versioned definition of steps (runs live in the flows app), and its limits
    "workflow": ("workers.definitions", "workflow"),
    "Workflow": ("workers.definitions", "Workflow"),
    "DefinitionError": ("workers.definitions", "DefinitionError"),
    "MAX_STEPS": ("workers.definitions", "MAX_STEPS"),
    "MAX_RUN_STATE_BYTES": ("workers.definitions", "MAX_RUN_STATE_BYTES"),
    "MAX_SIGNAL_PAYLOAD_BYTES": ("workers.definitions", "MAX_SIGNAL_PAYLOAD_BYTES"),
    "MAX_PENDING_SIGNALS": ("workers.definitions", "MAX_PENDING_SIGNALS"),
}

__all__ = [
    "ABSENT",
    "MAX_PENDING_SIGNALS",
    "MAX_RUN_STATE_BYTES",
    "MAX_SIGNAL_PAYLOAD_BYTES",
    "MAX_STEPS",
    "Declined",
    "DefinitionError",
    "Delivery",
    "EnqueueError",
    "EnqueueResult",
    "JobContext",
    "JobKind",
    "JobSpec",
    "KindHandle",
    "Miss",
    "ModelPrice",
    "NotPerformed",
    "OperationResult",
    "OutcomeUnknown",
    "Processing",
    "ReconcileAnswer",
    "Retryable",
    "RetryableError",
    "StepFailure",
    "TerminalFailure",
    "Workflow",
    "applicable_budgets",
    "enqueue",
    "enqueue_many",
    "job_kind",
    "model_price",
    "price_tokens",
    "remote_kind",
    "workflow",
]

if TYPE_CHECKING:
    from workers.context import JobContext
    from workers.definitions import (
        MAX_PENDING_SIGNALS,
        MAX_RUN_STATE_BYTES,
        MAX_SIGNAL_PAYLOAD_BYTES,
        MAX_STEPS,
        DefinitionError,
        Workflow,
        workflow,
    )
    from workers.errors import (
        Declined,
        EnqueueError,
        NotPerformed,
        OutcomeUnknown,
        Retryable,
        RetryableError,
        StepFailure,
        TerminalFailure,
    )
    from workers.handles import KindHandle, job_kind, remote_kind
    from workers.kinds import JobKind
    from workers.ledger import ABSENT, Miss, OperationResult, Processing, ReconcileAnswer
    from workers.models import Delivery, ModelPrice
    from workers.services.budgets import applicable as applicable_budgets
    from workers.services.budgets import model_price, price_tokens
    from workers.services.jobs import EnqueueResult, JobSpec, enqueue, enqueue_many
else:

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            # Not a public name: a submodule (``from workers import sql``) is imported by the import
            # system after this AttributeError; anything else is a typo.
            raise AttributeError(f"module 'workers' has no attribute {name!r}")
        value = getattr(importlib.import_module(home[0]), home[1])
        globals()[name] = value  # the next look-up is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(__all__)
