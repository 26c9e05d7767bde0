"""One vocabulary for a body in either runtime: the engine's names and the HTTP SDK's, and what each records.

A body in Koala (an RQ worker) and a body in an HTTP worker (koala_worker) may raise the same
names: ``Retryable`` / ``RetryableError`` (retried) and ``TerminalFailure`` / ``StepFailure``
(failed, terminal), each importable from both roots. Whichever runtime ran it, one error is
recorded under one name, decided by one rule: the engine's ``outcomes.decide`` from what an RQ
body raised (``Raised``) and from what the SDK reported over HTTP (``Reported``, mapped as
``api.protocol.fail`` maps it) give the same decision.
"""

from __future__ import annotations

import random
from typing import Any

import koala_worker
import pytest
from koala_worker import failure_payload
from koala_worker.context import raise_for

import workers
from workers import errors, outcomes
from workers.kinds import JobKind
from workers.models import Delivery
from workers.services.leases import Lease

# The names both roots export, documented in docs/engine.md ("One vocabulary with the SDK").
BODY_ERRORS = {"Retryable", "RetryableError", "TerminalFailure", "StepFailure"}
PERFORM_ERRORS = {"NotPerformed", "Declined", "OutcomeUnknown"}
RESULTS = {"OperationResult", "ABSENT", "Miss", "Processing"}
# Raised to the caller of enqueue, or at import by a workflow declared wrongly, never by a body:
# not the SDK's business.
ENQUEUE_SIDE = {"EnqueueError", "DefinitionError"}

# api.protocol.fail: the SDK's classification on the wire -> the engine's.
WIRE = {"retryable": outcomes.Classification.RETRYABLE, "step_failure": outcomes.Classification.TERMINAL}


class Top(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def _body(ctx: Any, data: dict[str, Any]) -> None:
    return None


KIND = JobKind(name="t.vocabulary", version=1, body=_body, backoff_base=1.0, backoff_cap=60.0)
LEASE = Lease(
    job_id=1,
    attempt_id=1,
    kind="t.vocabulary",
    version=1,
    queue="default",
    input={},
    run_state={},
    progress={},
    lease_token=1,
    attempts=1,
    max_attempts=3,
    delivery=Delivery.AT_LEAST_ONCE,
    timeout_seconds=30.0,
    deadline_at=None,
    correlation_id="c",
    trace_id="t",
    idempotency_key=None,
    created_by="",
    operation_key_base="",
)


def test_the_roots_share_the_names_a_body_and_its_operations_use() -> None:
    shared = BODY_ERRORS | PERFORM_ERRORS | RESULTS
    assert shared <= set(workers.__all__)
    assert shared <= set(koala_worker.__all__)
    # Every error the public root exports is in the shared vocabulary (or enqueue-side): adding one
    # to the root without its SDK counterpart (or a decision that it has none) fails here.
    root_errors = {
        n for n in workers.__all__ if isinstance(getattr(workers, n), type) and issubclass(getattr(workers, n), Exception)
    }
    assert root_errors == BODY_ERRORS | PERFORM_ERRORS | ENQUEUE_SIDE


def test_each_sdk_name_is_the_engines_kind_of_error_and_back() -> None:
    # In the engine the SDK's names are subclasses of its own; in the SDK, the engine's of the SDK's.
    assert issubclass(workers.RetryableError, workers.Retryable)
    assert issubclass(workers.StepFailure, workers.TerminalFailure)
    assert issubclass(koala_worker.Retryable, koala_worker.RetryableError)
    assert issubclass(koala_worker.TerminalFailure, koala_worker.StepFailure)


def both(name: str, engine_base: type[Exception], sdk_base: type[Exception], **attrs: Any) -> tuple[type, type]:
    """A kind's own error class of the same name in each runtime (records carry the class name)."""
    return type(name, (engine_base,), attrs), type(name, (sdk_base,), attrs)


CardExpired, SdkCardExpired = both("CardExpired", errors.StepFailure, koala_worker.StepFailure, code="card_expired")
Flaky, SdkFlaky = both("Flaky", errors.StepFailure, koala_worker.StepFailure)
Closed, SdkClosed = both("Closed", errors.TerminalFailure, koala_worker.TerminalFailure)


# (what an RQ body raises, what an HTTP body raises, the record both make)
SAME_ERROR = [
    (errors.Retryable("503"), koala_worker.Retryable("503"), "Retryable"),
    (errors.Retryable("429", retry_after=5), koala_worker.Retryable("429", retry_after=5), "Retryable"),
    (errors.RetryableError("503"), koala_worker.RetryableError("503"), "RetryableError"),
    (errors.RetryableError("429", 5), koala_worker.RetryableError("429", 5), "RetryableError"),
    (errors.TerminalFailure("closed"), koala_worker.TerminalFailure("closed"), "TerminalFailure"),
    (
        errors.TerminalFailure("no", code="declined"),
        koala_worker.TerminalFailure("no", code="declined"),
        "TerminalFailure:declined",
    ),
    (errors.TerminalFailure("no", code=""), koala_worker.TerminalFailure("no", code=""), "TerminalFailure"),
    (Closed("closed", code="account_closed"), SdkClosed("closed", code="account_closed"), "Closed:account_closed"),
    (Closed("closed"), SdkClosed("closed"), "Closed"),
    (errors.StepFailure("closed"), koala_worker.StepFailure("closed"), "StepFailure"),
    (
        errors.StepFailure("closed", code="account_closed"),
        koala_worker.StepFailure("closed", code="account_closed"),
        "account_closed",
    ),
    (CardExpired("expired"), SdkCardExpired("expired"), "card_expired"),
    (Flaky("gone"), SdkFlaky("gone"), "Flaky"),
]


@pytest.mark.parametrize(("engine", "sdk", "recorded"), SAME_ERROR, ids=[f"{type(e).__name__}-{r}" for e, _, r in SAME_ERROR])
def test_one_error_is_recorded_alike_whichever_runtime_ran_the_body(engine: Exception, sdk: Exception, recorded: str) -> None:
    payload = failure_payload(sdk)
    assert outcomes.error_class_of(engine) == payload["error_class"] == recorded
    assert outcomes.Classification.of(engine) == WIRE[payload["classification"]]
    reported = outcomes.Reported(
        classification=WIRE[payload["classification"]],
        error_class=payload["error_class"],
        message=payload["message"],
        retry_after=payload.get("retry_after"),
    )
    raised = outcomes.decide(outcomes.Raised.of(engine), LEASE, KIND, rng=Top())
    assert raised == outcomes.decide(reported, LEASE, KIND, rng=Top())
    assert getattr(raised, "error_class", None) == recorded


def test_a_declined_charge_is_named_alike_in_both_runtimes_and_the_sdk_keeps_the_servers_name() -> None:
    # An RQ body's ledger raises this for a declined charge; the server answers an HTTP worker's
    # operation with its name (api.protocol._action_for uses the same error_class_of).
    declined = errors.TerminalFailure("charge 'charge' declined: card declined", code="declined")
    name = outcomes.error_class_of(declined)
    assert name == "TerminalFailure:declined"
    with pytest.raises(koala_worker.TerminalFailure) as raised:
        raise_for({"action": "raise", "classification": "step_failure", "error_class": name, "message": str(declined)})
    assert isinstance(raised.value, koala_worker.StepFailure) and raised.value.code == "declined"
    assert failure_payload(raised.value)["error_class"] == name  # sent back verbatim
    # Any other name the server gives is kept verbatim too, as a plain StepFailure.
    with pytest.raises(koala_worker.StepFailure) as other:
        raise_for({"action": "raise", "classification": "step_failure", "error_class": "OperationMismatch:operation_mismatch"})
    assert not isinstance(other.value, koala_worker.TerminalFailure)
    assert failure_payload(other.value)["error_class"] == "OperationMismatch:operation_mismatch"


def test_the_sdk_aliases_take_the_engines_arguments() -> None:
    assert koala_worker.Retryable("x", retry_after=2).retry_after == 2
    assert koala_worker.TerminalFailure("x").code == "terminal"
    assert koala_worker.TerminalFailure("x", code="unauthorized").code == "unauthorized"
    assert errors.RetryableError("x", 3).retry_after == 3  # the SDK's positional retry_after
    assert errors.StepFailure("x", "unknown_account").code == "unknown_account"  # and its positional code
