"""The named errors of workflow runs: each has a stable ``code`` (the API and the command show it)."""

from __future__ import annotations


class FlowError(Exception):
    code = "flow_error"


class UnknownDefinition(FlowError):
    code = "unknown_definition"


class UnknownVersion(FlowError):
    code = "unknown_version"


class BadInput(FlowError):
    code = "bad_input"


class RunStateTooLarge(FlowError):
    code = "run_state_too_large"


class SignalTooLarge(FlowError):
    code = "signal_too_large"


class TooManyPendingSignals(FlowError):
    code = "too_many_pending_signals"


class IdempotencyConflict(FlowError):
    code = "idempotency_conflict"


class RunFinished(FlowError):
    code = "run_finished"


class UnknownRun(FlowError):
    code = "unknown_run"


class BadSignal(FlowError):
    code = "bad_signal"
