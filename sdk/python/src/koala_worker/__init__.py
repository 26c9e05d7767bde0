"""Koala's worker SDK for Python: a client of the HTTP worker protocol (docs/worker-api.md).

from koala_worker import Client, Worker

worker = Worker(Client("http://koala:8000", "kk_…"), concurrency=8).register("echo", 1, lambda ctx, input: {"echo": input})
worker.serve()
"""

from koala_worker.backoff import backoff_delay
from koala_worker.client import SDK, Client
from koala_worker.context import ABSENT, Context, Miss, OperationResult, Processing
from koala_worker.errors import (
    AlreadyRecorded,
    ApiError,
    Declined,
    JobCancelled,
    KoalaError,
    LeaseExpired,
    LeaseSuperseded,
    NotPerformed,
    OperationFailed,
    OutcomeUnknown,
    Reason,
    Rejected,
    Retryable,
    RetryableError,
    StepFailure,
    StopRequested,
    TerminalFailure,
    Unavailable,
)
from koala_worker.lease import HeartbeatAnswer, Lease, LeaseFormatError, Registration
from koala_worker.spans import Span
from koala_worker.worker import Worker, failure_payload
from koala_worker.workflow import Workflow

__version__ = "0.1.0"

__all__ = [
    "ABSENT",
    "SDK",
    "AlreadyRecorded",
    "ApiError",
    "Client",
    "Context",
    "Declined",
    "HeartbeatAnswer",
    "JobCancelled",
    "KoalaError",
    "Lease",
    "LeaseExpired",
    "LeaseFormatError",
    "LeaseSuperseded",
    "Miss",
    "NotPerformed",
    "OperationFailed",
    "OperationResult",
    "OutcomeUnknown",
    "Processing",
    "Reason",
    "Registration",
    "Rejected",
    "Retryable",
    "RetryableError",
    "Span",
    "StepFailure",
    "StopRequested",
    "TerminalFailure",
    "Unavailable",
    "Worker",
    "Workflow",
    "backoff_delay",
    "failure_payload",
]
