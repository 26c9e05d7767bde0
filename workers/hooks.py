"""How apps above the engine plug into it, without the engine importing them.

The engine (``workers``) sits below ``reviews``, ``exports`` and ``console``: it must run with
none of them installed and never import them. Where it needs their help it calls through this
registry, which each app fills in its ``AppConfig.ready``:

- **beat tasks**: periodic work the beat runs each tick, after the engine's own (an app's
  housekeeping, e.g. expiring undecided reviews, settling exports);
- **on-cancel callbacks**: run inside the cancel's transaction, after the job row is locked
  (e.g. withdrawing a cancelled job's open reviews), so the lock order stays job → others;
- **the review gate**: what the ledger asks before a critical operation (digest of the exact
  action, is there a usable approval, ask for one);
- **on-transition callbacks**: told, inside the transaction that records it, of every change of a
  job's state the engine makes (an attempt's end through ``workers.transitions``, the reaper's
  requeues and failures, a cancel, a review's rejection, an unpark): what hangs on a job reaching a
  state (a workflow's dependants becoming due, a metric's counter) commits with it or not at all;
- **span sinks**: given, inside the transaction that records an attempt's end, the spans its body
  recorded (``ctx.span``, the ledger's operations, an HTTP worker's reported spans), to store with
  it (``traces`` keeps them and exports them); with no sink registered they are dropped;
- **span parents**: who says which span a job's attempt spans hang under (a workflow's step span);
  without one an attempt's span is a root of the job's trace;
- **tick tasks**: bounded housekeeping that ``koala_tick NAME`` runs once under a lease (started
  by a systemd timer: retention pruning, the exports' temporary-file sweep, a daily budget
  report); the task is handed a ``TickLease`` to check between its bounded steps;
- **rejection counters**: told the name of every named refusal the engine or the API makes (a
  stale lease's ``lease_expired``, a budget's ``budget_exhausted``, an API call's ``api_forbidden``)
  so an app can count them (``metrics`` keeps the tallies); with none registered it costs a dict
  lookup;
- **retention**: asked, inside each prune batch's transaction (``workers.services.retention``),
  which of the finished jobs about to be deleted must stay (a workflow's live run, an unsettled
  export, an open review), then told which go, to delete or detach the app's own rows that
  reference them (spans, reviews) before the engine deletes the jobs in the same commit.

Registration is idempotent by name, so a second ``ready()`` (tests, autoreload) replaces
rather than duplicates. The registry holds callables only; it never imports an app.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class BeatTask:
    name: str
    run: Callable[[], Any]  # returns something loggable (a count, a report)


class TickLease(Protocol):
    """What a tick task is handed: ``hold()`` renews the run's lease and raises
    ``workers.services.ticks.TickLeaseLost`` if another run took it (call it before each bounded step)."""

    name: str

    def hold(self) -> None: ...


@dataclass(frozen=True)
class TickTask:
    name: str
    # run(lease) → something loggable (a count, a mapping of counts); its bounded work calls
    # lease.hold() between steps.
    run: Callable[[TickLease], Any]
    help: str
    # How long a run may go between two lease.hold() calls before another run may take over.
    lease_seconds: float = 300.0


class ReviewGate(Protocol):
    """The review app's answer to "may this critical action happen?" (see reviews.gate)."""

    def digest(self, binding: dict[str, Any]) -> str: ...

    def consume_approval(self, *, job_id: int, operation_key: str, digest: str) -> bool: ...

    def request_review(
        self,
        *,
        job_id: int,
        operation_name: str,
        operation_key: str,
        action: str,
        digest: str,
        summary: dict[str, Any],
        amount_minor: int | None,
        currency: str,
        target: str,
        kind_version: str,
        requested_by: str,
    ) -> int:  # the review's id
        ...


class NoReviewGate(RuntimeError):
    """A critical operation was reached but no app provides a review gate: refuse, never run it."""


@dataclass(frozen=True)
class Transition:
    """A job reached ``state``: what an on-transition callback is told.

    ``outcome`` is the outcome its attempt recorded when an attempt ended (``succeeded``, ``retry``,
    ``failed``, ``parked``, ``interrupted``, ``unservable``, ``orphaned``, ``cancelled``), None when
    no attempt was running (a queued or parked job cancelled, failed or unparked by a person or
    the beat). ``cause`` says who moved it: ``attempt``, ``reaper``, ``operator``, ``review``,
    ``budget``, ``deadline``.
    """

    job_id: int
    kind: str
    version: int
    queue: str
    state: str
    outcome: str | None
    failure_reason: str | None
    cause: str
    # For an attempt that completed (state succeeded, cause attempt): what the body returned and
    # the state delta it set (ctx.set_state), as the completion stored them. None otherwise.
    result: Any = None
    state_delta: dict[str, Any] | None = None


OnTransition = Callable[[Sequence[Transition]], None]


@dataclass(frozen=True)
class BodySpan:
    """One span a body recorded: ``parent_id`` is another of the attempt's spans or the attempt's
    own span (``workers.spans.attempt_span_id``). Times are the body's clock (UTC). ``usage`` is
    the span's own (``input_tokens``, ``output_tokens``, ``cost_minor``, ``model``). Not redacted
    yet: the sink stores it through the attempt's redaction context."""

    span_id: str
    parent_id: str
    name: str
    started_at: datetime | None
    ended_at: datetime | None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    usage: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""  # the error class that ended it ("" when it ended normally)


@dataclass(frozen=True)
class AttemptSpans:
    """What a span sink is given: the spans of attempt ``attempt_id`` whose end was just recorded."""

    job_id: int
    attempt_id: int
    trace_id: str
    attempt_span_id: str
    spans: Sequence[BodySpan]


SpanSink = Callable[[AttemptSpans], None]


@dataclass(frozen=True)
class Retention:
    """An app's part in pruning finished jobs (``register_retention``). Both are called inside the
    batch's transaction, the job rows already locked, with at most one batch of ids.

    ``keep(job_ids, cutoff)`` → the ids among them that must stay (their rows stay, untouched,
    until a later pass asks again; ``cutoff`` is the pass's "finished before", for an app's own
    rows' age); ``forget(job_ids)`` deletes (or detaches: SET NULL) the app's rows
    that reference those jobs or their attempts and returns how many rows it touched."""

    name: str
    keep: Callable[[Sequence[int], datetime], set[int]] | None = None
    forget: Callable[[Sequence[int]], int] | None = None


# Job ids → the span id their attempt spans hang under (ids it does not know are left out).
SpanParents = Callable[[Sequence[int]], Mapping[int, str]]

_beat_tasks: dict[str, BeatTask] = {}
_tick_tasks: dict[str, TickTask] = {}
_on_cancel: dict[str, Callable[..., Any]] = {}
_on_transition: dict[str, OnTransition] = {}
_span_sinks: dict[str, SpanSink] = {}
_span_parents: dict[str, SpanParents] = {}
_review_gate: ReviewGate | None = None
_retention: dict[str, Retention] = {}
_rejection_counters: dict[str, Callable[[str], None]] = {}


# The beat's own steps (workers.services.maintenance.beat_tick), each with its BeatTask row: an
# app's beat task may not take one of these names, or its row would be mixed with the engine's.
ENGINE_BEAT_STEPS = ("reap", "pauses", "budgets", "breakers", "dispatch", "retention")


def register_beat_task(name: str, run: Callable[[], Any]) -> None:
    if name in ENGINE_BEAT_STEPS:
        raise ValueError(f"{name!r} is one of the beat's own steps ({', '.join(ENGINE_BEAT_STEPS)}); pick another name")
    _beat_tasks[name] = BeatTask(name=name, run=run)


def unregister_beat_task(name: str) -> None:
    _beat_tasks.pop(name, None)


def beat_tasks() -> list[BeatTask]:
    return list(_beat_tasks.values())


def register_tick_task(name: str, run: Callable[[TickLease], Any], *, help: str, lease_seconds: float = 300.0) -> None:
    """A task ``koala_tick NAME`` runs (``NAME`` is lowercase words joined by ``-``)."""
    if not name or not all(part.isalnum() and part.islower() for part in name.split("-")):
        raise ValueError(f"a tick task's name is lowercase words joined by '-', not {name!r}")
    _tick_tasks[name] = TickTask(name=name, run=run, help=help, lease_seconds=lease_seconds)


def unregister_tick_task(name: str) -> None:
    _tick_tasks.pop(name, None)


def tick_tasks() -> dict[str, TickTask]:
    return dict(sorted(_tick_tasks.items()))


def register_on_cancel(name: str, callback: Callable[..., Any]) -> None:
    """``callback(*, job_id: int, actor: str)``, called inside the cancel transaction."""
    _on_cancel[name] = callback


def run_on_cancel(*, job_id: int, actor: str) -> None:
    for callback in _on_cancel.values():
        callback(job_id=job_id, actor=actor)


def register_on_transition(name: str, callback: OnTransition) -> None:
    """``callback(transitions)``, called inside the transaction that changes the jobs' states,
    after the change (its own queries see the new rows). It may write in that transaction; if it
    raises, the transition is rolled back with it (the caller sees the error)."""
    _on_transition[name] = callback


def unregister_on_transition(name: str) -> None:
    _on_transition.pop(name, None)


def wants_transitions() -> bool:
    """Whether any app listens (the writer opens a transaction for the hook only then)."""
    return bool(_on_transition)


def run_on_transition(transitions: Sequence[Transition]) -> None:
    if not transitions:
        return
    for callback in list(_on_transition.values()):
        callback(transitions)


def register_span_sink(name: str, sink: SpanSink) -> None:
    """``sink(attempt_spans)``, called inside the transaction that records the attempt's end, only
    when that end landed (a fenced-out attempt's spans describe work someone else's outcome
    replaced). If it raises, the end is rolled back with it."""
    _span_sinks[name] = sink


def unregister_span_sink(name: str) -> None:
    _span_sinks.pop(name, None)


def wants_spans() -> bool:
    return bool(_span_sinks)


def record_spans(spans: AttemptSpans) -> None:
    for sink in list(_span_sinks.values()):
        sink(spans)


def register_span_parents(name: str, resolver: SpanParents) -> None:
    """``resolver(job_ids)`` → {job_id: parent span id} for the jobs whose attempts hang under a
    span of another's (a workflow's step span); called where attempt spans are stored."""
    _span_parents[name] = resolver


def unregister_span_parents(name: str) -> None:
    _span_parents.pop(name, None)


def span_parents(job_ids: Sequence[int]) -> dict[int, str]:
    found: dict[int, str] = {}
    for resolver in list(_span_parents.values()):
        found.update(resolver(job_ids))
    return found


def register_retention(
    name: str,
    *,
    keep: Callable[[Sequence[int], datetime], set[int]] | None = None,
    forget: Callable[[Sequence[int]], int] | None = None,
) -> None:
    _retention[name] = Retention(name=name, keep=keep, forget=forget)


def unregister_retention(name: str) -> None:
    _retention.pop(name, None)


def retention_keeps(job_ids: Sequence[int], cutoff: datetime) -> set[int]:
    """The ids among ``job_ids`` that some app says must stay."""
    kept: set[int] = set()
    for part in list(_retention.values()):
        if part.keep is not None and job_ids:
            kept |= part.keep(job_ids, cutoff)
    return kept


def retention_forget(job_ids: Sequence[int]) -> dict[str, int]:
    """Each app deletes or detaches its rows under ``job_ids``: rows touched, by app."""
    touched: dict[str, int] = {}
    for part in list(_retention.values()):
        if part.forget is not None and job_ids:
            touched[part.name] = part.forget(job_ids)
    return touched


def register_rejection_counter(name: str, counter: Callable[[str], None]) -> None:
    """``counter(reason)``, called where a named refusal is made, possibly inside a transaction
    that then rolls back. It must be cheap and must never raise into the engine."""
    _rejection_counters[name] = counter


def unregister_rejection_counter(name: str) -> None:
    _rejection_counters.pop(name, None)


def count_rejection(reason: str) -> None:
    """Tell the counters of one named refusal (a closed set of names, never free text)."""
    for counter in list(_rejection_counters.values()):
        counter(reason)


def register_review_gate(gate: ReviewGate) -> None:
    global _review_gate
    _review_gate = gate


def review_gate() -> ReviewGate:
    if _review_gate is None:
        raise NoReviewGate("a critical operation needs a review gate; install the reviews app")
    return _review_gate
