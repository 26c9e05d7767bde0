"""How the SDK reports a body's exception (fail's fields) and maps the ledger's answers."""

from __future__ import annotations

import pytest
from koala_worker import (
    ABSENT,
    Miss,
    OperationFailed,
    OperationResult,
    Processing,
    RetryableError,
    StepFailure,
    failure_payload,
)
from koala_worker.context import lookup_payload, raise_for
from koala_worker.errors import Abandon


class CardExpired(StepFailure):
    pass


class ProviderDown(RetryableError):
    pass


def test_a_retryable_error_is_retryable_with_its_delay() -> None:
    assert failure_payload(RetryableError("provider timed out", retry_after=5)) == {
        "classification": "retryable",
        "error_class": "RetryableError",
        "message": "provider timed out",
        "retry_after": 5,
    }
    assert failure_payload(ProviderDown("down")) == {
        "classification": "retryable",
        "error_class": "ProviderDown",
        "message": "down",
    }


def test_a_step_failure_is_typed_by_its_code_or_its_class() -> None:
    assert failure_payload(StepFailure("no such account", code="unknown_account")) == {
        "classification": "step_failure",
        "error_class": "unknown_account",
        "message": "no such account",
    }
    assert failure_payload(CardExpired("expired"))["error_class"] == "CardExpired"
    assert failure_payload(StepFailure("x"))["error_class"] == "StepFailure"


def test_anything_else_is_fatal_and_sends_the_message_only() -> None:
    def deep() -> None:
        raise KeyError("customer")

    try:
        deep()
    except KeyError as exc:
        payload = failure_payload(exc)
    assert payload == {"classification": "fatal", "error_class": "KeyError", "message": "'customer'"}
    assert "Traceback" not in payload["message"] and "deep" not in payload["message"]


def test_an_empty_message_names_the_class_and_a_long_one_is_cut() -> None:
    assert failure_payload(ValueError())["message"] == "ValueError"
    assert len(failure_payload(ValueError("x" * 10_000))["message"]) == 4000


def test_reconcile_answers_become_the_lookup_of_the_next_begin() -> None:
    found = OperationResult(external_id="ch_1", data={"charge": "ch_1"}, cost_minor=1200)
    assert lookup_payload(found) == {
        "found": {"external_id": "ch_1", "data": {"charge": "ch_1"}, "cost_minor": 1200, "usage": None}
    }
    assert lookup_payload(ABSENT) == {"absent": True}
    assert lookup_payload(Miss(30)) == {"miss": {"window_seconds": 30}}
    assert lookup_payload(Processing(5.5)) == {"processing": {"window_seconds": 5.5}}
    assert lookup_payload(None) == {"unknown": True}


def test_a_raise_action_raises_the_sdks_error_of_its_classification() -> None:
    with pytest.raises(RetryableError) as retry:
        raise_for({"action": "raise", "classification": "retryable", "message": "charge: not performed", "retry_after": 2})
    assert (str(retry.value), retry.value.retry_after) == ("charge: not performed", 2)
    with pytest.raises(StepFailure) as terminal:
        raise_for({"action": "raise", "classification": "step_failure", "message": "declined", "error_class": "declined"})
    assert terminal.value.error_class == "declined"
    assert failure_payload(terminal.value)["classification"] == "step_failure"
    with pytest.raises(OperationFailed):
        raise_for({"action": "raise", "classification": "fatal", "message": "mismatch"})


def test_a_stop_action_ends_the_body_past_a_broad_except() -> None:
    with pytest.raises(Abandon, match="waiting_review"):
        try:
            raise_for({"action": "stop", "reason": "waiting_review"})
        except Exception:  # a body's catch-all must not swallow the stop
            pytest.fail("the stop was caught as an Exception")


def test_an_error_class_koala_would_refuse_is_made_a_name_it_accepts() -> None:
    assert failure_payload(StepFailure("x", code="card declined!"))["error_class"] == "card_declined_"
    assert failure_payload(StepFailure("x", code="9lives"))["error_class"] == "_9lives"
    assert failure_payload(StepFailure("x", code="billing.declined:v2"))["error_class"] == "billing.declined:v2"


def test_a_retry_after_is_kept_within_the_contracts_bounds() -> None:
    assert failure_payload(RetryableError("x", retry_after=10**9))["retry_after"] == 86400.0
    assert failure_payload(RetryableError("x", retry_after=-3))["retry_after"] == 0.0
