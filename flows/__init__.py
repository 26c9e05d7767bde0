"""Workflow runs above the engine: a run of a definition declared in code (``workers.workflow``).

Each step attempt is an ordinary Koala job attempt (lease, fence, ledger, budgets, pauses, review
gate, the one transition writer). This app keeps the run and plugs into the engine through
``workers.hooks``: an on-transition callback (``services.on_transitions``) that, inside the
transaction ending a step's job, records the step's output, merges its state delta into the run's
state and makes its dependants due; and a beat task (wait timeouts, the jobs of ended runs).

What the API, the console and the SDKs build on (keyword-only; errors in ``flows.errors``, each
with a stable ``code``):

Writes (``flows.services``):

- ``start_run(*, definition: str, version: int | None = None, input: dict, idempotency_key: str | None = None,
  actor: str, correlation_id: str = "") -> StartedRun(run: Run, created: bool)``
  (UnknownDefinition, UnknownVersion, BadInput, IdempotencyConflict)
- ``send_signal(*, run_id: int, name: str, key: str, payload: dict | None, actor: str)
  -> SignalAnswer(outcome: "resumed" | "buffered" | "duplicate" | "rejected", signal_id: int | None)``
  (UnknownRun, BadSignal, SignalTooLarge, TooManyPendingSignals)
- ``cancel_run(*, run_id: int, actor: str, reason: str = "") -> Run`` (UnknownRun, RunFinished)
- ``move_to_version(*, run_id: int, to_version: int, actor: str) -> Run`` (UnknownRun, RunFinished, UnknownVersion)
- ``trace_id_of(run_id) -> str``: the run's trace id (every step span shares it)

Reads (``flows.selectors``):

- ``run_view(run_id: int) -> RunView | None``: the journal: steps (state, version, job, attempts with
  worker ids, outcomes and errors, wait event and deadline, output, ``state_after``, operations,
  usage, cost, step span id), signals, the run's state, totals
- ``list_runs(*, state=None, definition=None, limit=50, before_id=None) -> list[Run]``
- ``stranded_runs(*, live_seconds=None, definitions_=None) -> list[StrandedRun]``: live runs whose due
  step is of a version no live worker (RQ or HTTP) serves
- ``served_pairs(*, live_seconds=None) -> set[str]``

The lease of a step (both runtimes, ``workers.services.leases.Lease``; JSON in ``api.protocol``)
carries ``step``, ``steps`` (the earlier steps' outputs by name), ``state`` (the run's state as the
step became due), ``run`` (id, state, correlation_id), ``idempotency_key`` (``koala-run-<id>-<step>``,
stable across retries, reclaims and version moves), ``trace_id`` (the run's) and ``span_id`` (the
attempt's, ``workers.spans.attempt_span_id``). Run states: running, waiting (only waits or parked jobs pending), succeeded,
failed, cancelled; terminal ones never change (conditional UPDATEs).
"""
