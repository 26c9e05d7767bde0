"""The engine's durable records. PostgreSQL is the truth; Redis only rings the doorbell.

The database carries the rules (CHECK constraints, partial unique indexes) so that
no code path, present or future, can write a state the engine does not know.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


def operation_key_base(*, job_id: int, idempotency_key: str | None, carried: str = "") -> str:
    """The prefix of a job's operation keys: stable across its attempts and its operator retries.

    A retry carries its original's base (``Job.operation_key_base``), so a chain of retries
    sends under one set of keys; otherwise the job's idempotency key, else ``koala-job-<id>``.
    """
    return carried or idempotency_key or f"koala-job-{job_id}"


class JobState(models.TextChoices):
    QUEUED = "queued"  # waiting; due when scheduled_at <= now()
    RUNNING = "running"  # leased by exactly one attempt
    PARKED = "parked"  # set aside, no lease and no worker waiting: see park_reason
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class ParkReason(models.TextChoices):
    WAITING_REVIEW = "waiting_review"  # a critical operation needs an approval bound to its digest
    NEEDS_ATTENTION = "needs_attention"  # an uncertain operation no reconcile hook could settle
    BUDGET = "budget"  # a budget limit is exhausted for the current period


class Delivery(models.TextChoices):
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


class FailureReason(models.TextChoices):
    TERMINAL = "terminal"  # the body raised a typed terminal failure
    FATAL = "fatal"  # an unclassified exception: never retried blindly
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # retryable, but the budget is spent
    ORPHANED = "orphaned"  # lease expired; at_most_once cannot know if the body ran
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the job's overall deadline passed
    REVIEW_REJECTED = "review_rejected"  # a reviewer rejected a critical operation
    REVIEW_EXPIRED = "review_expired"  # nobody decided a critical operation in time
    MEMORY_LIMIT = "memory_limit"  # the last attempt went past its memory ceiling (workers.bounds)
    CPU_LIMIT = "cpu_limit"  # the last attempt went past its CPU-time ceiling (workers.bounds)


class Outcome(models.TextChoices):
    SUCCEEDED = "succeeded"
    RETRY = "retry"  # retryable error, job rescheduled with backoff
    FAILED = "failed"  # terminal or fatal (see error_class / job.failure_reason)
    ORPHANED = "orphaned"  # lease expired without a report
    UNSERVABLE = "unservable"  # the worker lacks this kind/version: no attempt used
    CANCELLED = "cancelled"  # an operator cancelled the job
    INTERRUPTED = "interrupted"  # released on shutdown, a stop pause, or requeued by an operator (Attempt.requeued_by)
    PARKED = "parked"  # the job was parked (review, needs attention, budget): no attempt used


class Job(models.Model):
    kind = models.CharField(max_length=100)
    version = models.PositiveIntegerField(help_text="Contract version of the kind's input.")
    queue = models.CharField(max_length=64)
    input = models.JSONField(default=dict, help_text="Small references, never customer data or credentials.")
    input_fingerprint = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first.")
    delivery = models.CharField(max_length=16, choices=Delivery.choices, default=Delivery.AT_LEAST_ONCE)
    scheduled_at = models.DateTimeField(help_text="Not claimed before this time (delay or backoff).")
    deadline_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts used (unservable/released ones excluded).")
    max_attempts = models.PositiveIntegerField()
    timeout_seconds = models.FloatField(help_text="Per-attempt time limit.")

    # The lease. lease_token is the fencing token: every write by an attempt names it.
    lease_token = models.BigIntegerField(default=0)
    lease_holder = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    progress = models.JSONField(default=dict, blank=True, help_text="Last checkpoint stored by a heartbeat.")
    run_state = models.JSONField(default=dict, blank=True, help_text="Merged by top-level key at completion.")
    result = models.JSONField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="", help_text="Redacted; never a stack trace.")
    park_reason = models.CharField(max_length=32, choices=ParkReason.choices, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    park_detail = models.TextField(blank=True, default="", help_text="Why the job is parked (redacted).")
    parked_on = models.JSONField(default=dict, blank=True, help_text="What unparks it (budget id, need).")
    parked_at = models.DateTimeField(null=True, blank=True)

    correlation_id = models.CharField(max_length=64, blank=True, default="")
    trace_id = models.CharField(max_length=32, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    operation_key_base = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",  # the engine's hand-written INSERTs (enqueue_many) do not name it
        help_text="An operator retry's carried key: its operation keys are its original's, so it can never send an "
        "effect twice. Empty: the job's own (idempotency key or koala-job-<id>).",
    )
    # A workflow's step (the flows app above the engine keeps the run; the engine only carries
    # what the step's lease shows): the run's id, the step's name, and its parents' outputs by
    # name. NULL / "" / {} for a job of its own.
    run_id = models.BigIntegerField(null=True, blank=True, help_text="The workflow run this job is a step of.")
    step = models.CharField(max_length=100, blank=True, default="", db_default="", help_text="The step's name in its run.")
    steps = models.JSONField(
        default=dict, blank=True, db_default=models.Value("{}"), help_text="Earlier steps' outputs by name (a step's lease)."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in JobState]), name="job_state_valid"),
            models.CheckConstraint(condition=Q(delivery__in=[d.value for d in Delivery]), name="job_delivery_valid"),
            models.CheckConstraint(
                condition=Q(failure_reason__isnull=True) | Q(failure_reason__in=[r.value for r in FailureReason]),
                name="job_failure_reason_valid",
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="job_max_attempts_positive"),
            models.CheckConstraint(condition=Q(attempts__lte=models.F("max_attempts")), name="job_attempts_bounded"),
            # A running job always has a holder and an expiry; nothing else does.
            models.CheckConstraint(
                condition=(
                    Q(state=JobState.RUNNING, lease_holder__isnull=False, lease_expires_at__isnull=False)
                    | (~Q(state=JobState.RUNNING) & Q(lease_holder__isnull=True, lease_expires_at__isnull=True))
                ),
                name="job_lease_iff_running",
            ),
            models.CheckConstraint(
                condition=Q(state=JobState.FAILED, failure_reason__isnull=False)
                | (~Q(state=JobState.FAILED) & Q(failure_reason__isnull=True)),
                name="job_failed_has_reason",
            ),
            models.CheckConstraint(
                condition=Q(state=JobState.PARKED, park_reason__in=[r.value for r in ParkReason])
                | (~Q(state=JobState.PARKED) & Q(park_reason__isnull=True)),
                name="job_parked_has_reason",
            ),
            models.UniqueConstraint(
                fields=["kind", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_unique_per_kind",
            ),
        ]
        indexes = [
            # Matches the claim query: WHERE state='queued' AND queue=? ORDER BY priority DESC, scheduled_at, id
            models.Index(
                "queue",
                models.F("priority").desc(),
                "scheduled_at",
                "id",
                condition=Q(state=JobState.QUEUED),
                name="job_claim_idx",
            ),
            # Matches the reaper: WHERE state='running' AND lease_expires_at < now()
            models.Index(fields=["lease_expires_at"], condition=Q(state=JobState.RUNNING), name="job_lease_expiry_idx"),
            # Matches the reaper's deadline step: WHERE state='queued' AND deadline_at IS NOT NULL AND
            # deadline_at <= now(). Without it that step read every queued row on every beat tick.
            models.Index(
                fields=["deadline_at"],
                condition=Q(state=JobState.QUEUED, deadline_at__isnull=False),
                name="job_queued_deadline_idx",
            ),
            models.Index(fields=["park_reason", "parked_at"], condition=Q(state=JobState.PARKED), name="job_parked_idx"),
            # The console's job list: ORDER BY created_at DESC, id DESC LIMIT 50 under its filters
            # (console.selectors.jobs.filtered_jobs). Each ends in exactly that order, so a page is an index
            # range read of 50 entries whatever the table's size (migration 0009).
            models.Index(fields=["-created_at", "-id"], name="job_list_idx"),
            models.Index(fields=["state", "-created_at", "-id"], name="job_state_list_idx"),
            models.Index(fields=["kind", "state", "-created_at", "-id"], name="job_kind_state_list_idx"),
            models.Index(fields=["queue", "state", "-created_at", "-id"], name="job_queue_state_list_idx"),
            # The list's failure-reason filter (a failure reason implies state 'failed'); small.
            models.Index(
                fields=["failure_reason", "-created_at", "-id"], condition=Q(state=JobState.FAILED), name="job_failed_list_idx"
            ),
            # The console's search: exact match on a trace, correlation or idempotency key
            # (the unique (kind, idempotency_key) index cannot serve a key without its kind).
            models.Index(fields=["trace_id"], name="job_trace_idx"),
            # A run's step jobs (the flows app's sweeps and journal); small: steps only.
            models.Index(fields=["run_id"], condition=Q(run_id__isnull=False), name="job_run_idx"),
            models.Index(fields=["correlation_id"], name="job_correlation_idx"),
            models.Index(fields=["idempotency_key"], condition=Q(idempotency_key__isnull=False), name="job_idempotency_key_idx"),
            # The dashboard's completions/error rate per queue and hourly charts: WHERE finished_at
            # >= now() - 1 day, grouped by queue or hour and state. Covering (state, queue), so
            # both are an index-only range read of the window, never a heap fetch per job (0010).
            models.Index(
                fields=["finished_at"],
                include=["state", "queue"],
                condition=Q(finished_at__isnull=False),
                name="job_finished_cover_idx",
            ),
            # The dashboard's per-queue backlog: the oldest due job (the first entry at or before
            # now) and the capped due count, each a range of one queue's entries (0010). The
            # predicate also says scheduled_at IS NOT NULL (always true, the column is NOT NULL):
            # the planner then offers this index only to statements that bound scheduled_at, so
            # the dispatcher's queue walk and the claim keep job_claim_idx.
            models.Index(
                fields=["queue", "scheduled_at", "id"],
                condition=Q(state=JobState.QUEUED, scheduled_at__isnull=False),
                name="job_queued_due_idx",
            ),
            # The metrics scrape's running and parked counts by queue (and park reason): an
            # index-only read of the live rows only, whatever the table holds (0019).
            models.Index(
                fields=["state", "queue", "park_reason"],
                condition=Q(state__in=[JobState.RUNNING, JobState.PARKED]),
                name="job_live_idx",
            ),
            # The metrics scrape's failures since its fold mark: an index-only range (0019); failed jobs only.
            models.Index(
                fields=["finished_at"],
                include=["queue", "kind", "failure_reason"],
                condition=Q(state=JobState.FAILED, finished_at__isnull=False),
                name="job_failed_finished_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}@{self.version} #{self.pk} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Attempt(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField(help_text="1-based order among this job's attempts.")
    worker_id = models.CharField(max_length=200)
    lease_token = models.BigIntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="", help_text="Redacted; never a stack trace.")
    # The operator whose requeue took this running attempt's job away (outcome interrupted): its
    # holder is fenced, and its writes are rejected as lease_superseded once the job is claimed again.
    requeued_by = models.CharField(
        max_length=150,
        blank=True,
        default="",
        db_default="",  # the claim's hand-written INSERT (workers.sql) does not name it
        help_text="Who requeued the job while this attempt held it (its holder was fenced); empty otherwise.",
    )
    compute_seconds = models.FloatField(null=True, blank=True)
    db_wait_seconds = models.FloatField(null=True, blank=True)
    storage_wait_seconds = models.FloatField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "lease_token"], name="attempt_one_per_lease_token"),
            # At most one live lease per job: only one unfinished attempt may exist.
            models.UniqueConstraint(fields=["job"], condition=Q(finished_at__isnull=True), name="attempt_one_live_per_job"),
            models.CheckConstraint(
                condition=Q(outcome__isnull=True) | Q(outcome__in=[o.value for o in Outcome]),
                name="attempt_outcome_valid",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True, outcome__isnull=True) | Q(finished_at__isnull=False, outcome__isnull=False),
                name="attempt_finished_iff_outcome",
            ),
        ]
        indexes = [
            models.Index(fields=["worker_id"], condition=Q(finished_at__isnull=True), name="attempt_live_worker_idx"),
            # The dashboard: run-time percentiles and error charts by finished_at, queue wait by
            # started_at, and each worker's last completed attempt.
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="attempt_finished_idx"),
            models.Index(fields=["started_at"], name="attempt_started_idx"),
            models.Index(fields=["worker_id", "-finished_at"], name="attempt_worker_finished_idx"),
        ]
        ordering = ["job_id", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id} ({self.outcome or 'running'})"


class WorkerExit(models.TextChoices):
    """How a worker process ended: a crash loop is repeated abnormal exits, never clean stops."""

    RUNNING = "", "running"
    STOPPED = "stopped", "stopped"  # clean: asked to stop (SIGTERM, Ctrl-C, --burst done) and recorded it itself
    CRASHED = "crashed", "crashed"  # left its loop on an unhandled error, and recorded it itself
    DIED = "died", "died"  # recorded nothing (kill -9, OOM, host loss): found by the next start under its name


ABNORMAL_EXITS = (WorkerExit.CRASHED, WorkerExit.DIED)


class WorkerProcess(models.Model):
    """One RQ worker process: the base for telling a crash loop from a stuck worker."""

    name = models.CharField(max_length=200, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    kinds = models.JSONField(default=list, help_text='Served kinds as "name@version".')
    worker_class = models.CharField(max_length=100)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    # A worker restarted under a fixed --name (a systemd instance) reuses its row: keep its
    # recent start times so a crash loop still shows as many starts, not one long life.
    recent_starts = models.JSONField(default=list, blank=True, help_text="ISO times of the latest starts (at most 20).")
    # How the process this row describes ended ("" while it runs). stopped_at is set by the
    # process itself for both STOPPED and CRASHED; DIED is only ever inferred by someone else.
    exit = models.CharField(max_length=10, choices=WorkerExit.choices, default=WorkerExit.RUNNING, blank=True)
    # The latest exits under this name, oldest first: {"at": ISO time, "exit": WorkerExit,
    # "pid": int, "detail": str}. For DIED, "at" is the last sign of life (last_seen_at).
    recent_exits = models.JSONField(default=list, blank=True, help_text="The latest exits under this name (at most 20).")
    # An HTTP worker's declared concurrency (docs/worker-api.md): the most leases it may hold.
    concurrency = models.PositiveIntegerField(default=1, help_text="The most leases it holds at once (HTTP workers).")
    # The prefix of the API key an HTTP worker registered with: only that key may act as it.
    api_key = models.CharField(max_length=32, blank=True, default="", help_text="Prefix of the registering API key.")
    # An HTTP worker that called stop while it still held leases: no server process hands it
    # another (the claim reads this column, so every process of every host agrees at once).
    # Cleared when the name registers again.
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # The contract of each kind as this process loaded it: "name@version" -> a digest of its
    # policy (workers.kinds.JobKind.contract_digest). Two hosts serving one kind@version with
    # different digests loaded different kind modules (workers.selectors.workers.contract_mismatches).
    # db_default: a worker of the previous release, still running during a deploy, writes rows without it.
    contracts = models.JSONField(
        default=dict, blank=True, db_default=models.Value("{}"), help_text='"name@version" -> digest of its contract.'
    )

    class Meta:
        ordering = ["-last_seen_at"]
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def silent_after_seconds() -> float:
        """Silence after which a worker that recorded no exit is taken as gone: a lease, and
        never less than three missed heartbeats."""
        return max(float(settings.KOALA_LEASE_SECONDS), 3 * float(settings.KOALA_HEARTBEAT_SECONDS))


class Span(models.Model):
    """Legacy: one span of an attempt's trace, as the worker API stored them before the ``traces``
    app. Nothing writes this table (``workers_span``) any more: since the traces app, every span
    (each attempt's own, and those its body recorded, an HTTP worker's included) is a row of
    ``traces_span`` (``traces.models.Span``, filled through workers.hooks), and that is what the
    console's journals read. It is kept, read-only in the admin, because migrations here are
    expand-only (tests/unit/test_migrations_expand_only.py): a later contract migration drops it,
    once no running release reads it.

    Its rows: the step span Koala opened for the attempt (no parent) and the spans an HTTP
    worker's body recorded under it; ``usage`` is the span's own (exclusive of its children)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="spans")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="spans")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_id = models.CharField(max_length=16, blank=True, default="")
    name = models.CharField(max_length=200)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True, help_text="Redacted.")
    usage = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["attempt", "span_id"], name="span_one_id_per_attempt")]
        indexes = [models.Index(fields=["trace_id"], name="span_trace_idx")]
        ordering = ["attempt_id", "id"]

    def __str__(self) -> str:
        return f"legacy span {self.name} of job {self.job_id}"


# -- The safety layer: operations ledger, budgets, prices, pauses -----------------------------


class OperationState(models.TextChoices):
    IN_FLIGHT = "in_flight"  # committed before the outbound call; the call may or may not have happened
    SUCCEEDED = "succeeded"  # the provider answered and the answer is stored
    FAILED = "failed"  # it definitely did not happen (declined, 429, or resolved as absent): safe to re-send
    UNCERTAIN = "uncertain"  # the call went out and no answer came back (timeout, 5xx)
    RECONCILED = "reconciled"  # after doubt, confirmed as happened (by the provider or a person)


DONE_OPERATION_STATES = (OperationState.SUCCEEDED, OperationState.RECONCILED)


class Resolution(models.TextChoices):
    NONE = ""
    FOUND = "found"  # reconcile() found it at the provider
    ABSENT = "absent"  # reconcile() proved it absent; re-sent with the same key
    MANUAL_HAPPENED = "manual_happened"  # a person confirmed it happened
    MANUAL_ABSENT = "manual_absent"  # a person confirmed it did not happen


class Operation(models.Model):
    """One side effect on the outside world, recorded before it is attempted.

    ``key`` is the idempotency key the provider sees; it is stable across retries of
    the step, so a re-run finds this row instead of calling out again.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="operations")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="operations")
    lease_token = models.BigIntegerField(help_text="The fence of the attempt that last wrote this row.")
    name = models.CharField(max_length=100, help_text="The step's name within its job.")
    key = models.CharField(max_length=300, unique=True)
    kind = models.CharField(max_length=50, help_text="email, order, charge, model_call, publish, …")
    fingerprint = models.CharField(max_length=64, help_text="sha256 of the canonical request parameters.")
    params = models.JSONField(default=dict, blank=True, help_text="Redacted request parameters.")
    state = models.CharField(max_length=16, choices=OperationState.choices)
    resolution = models.CharField(max_length=20, choices=Resolution.choices, blank=True, default="")
    external_id = models.CharField(max_length=200, blank=True, default="")
    response = models.JSONField(default=dict, blank=True, help_text="Redacted summary of the provider's answer.")
    result = models.JSONField(null=True, blank=True, help_text="What the body got back (redacted); returned on re-run.")
    amount_minor = models.BigIntegerField(null=True, blank=True)
    # db_default: a worker of the previous release, still running during a deploy, records
    # operations without naming the column (they then show their amount without a currency).
    currency = models.CharField(
        max_length=3,
        blank=True,
        default="",
        db_default="",
        help_text="The currency of amount_minor: the one the step named, else KOALA_COST_CURRENCY.",
    )
    target = models.CharField(max_length=200, blank=True, default="")
    estimate_minor = models.BigIntegerField(default=0)
    cost_minor = models.BigIntegerField(null=True, blank=True)
    # db_default: the ledger's hand-written INSERT (in flight, before any cost) leaves it out.
    overshoot_minor = models.BigIntegerField(
        default=0,
        db_default=0,
        help_text="Cost beyond the reservation (the call's upper bound): the provider billed more than the call "
        "could cost. Non-zero pauses the budget's scope.",
    )
    usage = models.JSONField(default=dict, blank=True)
    reservations = models.JSONField(
        default=list, blank=True, help_text="[[budget_usage_id, minor], …] held while the outcome is open."
    )
    error_message = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0, help_text="Times the call was sent.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in OperationState]), name="operation_state_valid"),
            models.CheckConstraint(condition=Q(resolution__in=[r.value for r in Resolution]), name="operation_resolution_valid"),
            models.CheckConstraint(
                condition=Q(cost_minor__isnull=True) | Q(cost_minor__gte=0), name="operation_cost_not_negative"
            ),
            models.CheckConstraint(condition=Q(estimate_minor__gte=0), name="operation_estimate_not_negative"),
            models.CheckConstraint(condition=Q(overshoot_minor__gte=0), name="operation_overshoot_not_negative"),
            # A reconciled row says how it was settled.
            models.CheckConstraint(
                condition=~Q(state=OperationState.RECONCILED) | Q(resolution__in=["found", "manual_happened"]),
                name="operation_reconciled_has_resolution",
            ),
        ]
        indexes = [
            models.Index(
                fields=["updated_at"],
                condition=Q(state__in=["in_flight", "uncertain"]),
                name="operation_open_idx",
            ),
            # The dashboard's overshoot list: a handful of rows, newest first.
            models.Index(fields=["-settled_at"], condition=Q(overshoot_minor__gt=0), name="operation_overshoot_idx"),
            # The metrics endpoint's last completed operation: max(settled_at), one descent (0019).
            models.Index(fields=["settled_at"], condition=Q(settled_at__isnull=False), name="operation_settled_idx"),
        ]
        ordering = ["job_id", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} of job {self.job_id} ({self.state})"

    @property
    def is_done(self) -> bool:
        return self.state in DONE_OPERATION_STATES


class Scope(models.TextChoices):
    GLOBAL = "global"
    QUEUE = "queue"
    KIND = "kind"


class Budget(models.Model):
    """Limits for one scope per period (a calendar day in ``timezone``). NULL = no limit."""

    name = models.CharField(max_length=100, unique=True)
    scope = models.CharField(max_length=10, choices=Scope.choices)
    target = models.CharField(max_length=100, blank=True, default="", help_text="Queue or kind name; empty for global.")
    tenant = models.CharField(max_length=100, blank=True, default="", help_text="Empty: every tenant together.")
    timezone = models.CharField(max_length=64, default="UTC", help_text="The period is the calendar day here.")
    spend_limit_minor = models.BigIntegerField(null=True, blank=True)
    request_limit = models.BigIntegerField(null=True, blank=True)
    concurrency_limit = models.IntegerField(null=True, blank=True)
    run_seconds_limit = models.BigIntegerField(null=True, blank=True)
    attempt_limit = models.BigIntegerField(null=True, blank=True)
    pause_on_exhaust = models.BooleanField(default=False, help_text="Pause the scope (drain) when a limit is hit.")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=[s.value for s in Scope]), name="budget_scope_valid"),
            models.CheckConstraint(
                condition=Q(scope=Scope.GLOBAL, target="") | (~Q(scope=Scope.GLOBAL) & ~Q(target="")),
                name="budget_target_matches_scope",
            ),
            models.CheckConstraint(
                condition=(
                    (Q(spend_limit_minor__isnull=True) | Q(spend_limit_minor__gte=0))
                    & (Q(request_limit__isnull=True) | Q(request_limit__gte=0))
                    & (Q(concurrency_limit__isnull=True) | Q(concurrency_limit__gte=0))
                    & (Q(run_seconds_limit__isnull=True) | Q(run_seconds_limit__gte=0))
                    & (Q(attempt_limit__isnull=True) | Q(attempt_limit__gte=0))
                ),
                name="budget_limits_not_negative",
            ),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        where = self.target or "everything"
        return f"{self.name} ({self.scope} {where}{' / ' + self.tenant if self.tenant else ''})"

    @property
    def currency(self) -> str:
        """The currency of its spend limit and usage: the one every cost is priced in
        (KOALA_COST_CURRENCY). Koala converts nothing, so a budget in another could not be kept."""
        return str(settings.KOALA_COST_CURRENCY)


class BudgetUsage(models.Model):
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="usage")
    period = models.DateField(help_text="The day in the budget's time zone.")
    spent_minor = models.BigIntegerField(default=0)
    reserved_minor = models.BigIntegerField(default=0, help_text="Held by calls whose outcome is still open.")
    requests = models.BigIntegerField(default=0)
    attempts = models.BigIntegerField(default=0)
    run_seconds = models.FloatField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["budget", "period"], name="budget_usage_one_per_period"),
            models.CheckConstraint(
                condition=Q(spent_minor__gte=0, reserved_minor__gte=0, requests__gte=0, attempts__gte=0),
                name="budget_usage_not_negative",
            ),
        ]
        ordering = ["-period"]

    def __str__(self) -> str:
        return f"{self.budget.name} {self.period}"


class ModelPrice(models.Model):
    """The one price table Koala uses to turn token usage into cost."""

    model = models.CharField(max_length=100, unique=True)
    input_minor_per_mtok = models.BigIntegerField(help_text="Minor units per million input tokens.")
    output_minor_per_mtok = models.BigIntegerField(help_text="Minor units per million output tokens.")
    updated_by = models.CharField(max_length=150, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(input_minor_per_mtok__gte=0, output_minor_per_mtok__gte=0), name="model_price_not_negative"
            )
        ]
        ordering = ["model"]

    def __str__(self) -> str:
        return self.model


class PauseMode(models.TextChoices):
    DRAIN = "drain"  # in-flight work finishes; nothing new is claimed
    STOP = "stop"  # in-flight attempts are cancelled at their next heartbeat and released


class PauseSource(models.TextChoices):
    MANUAL = "manual"
    CIRCUIT_BREAKER = "circuit_breaker"
    BUDGET = "budget"


class Pause(models.Model):
    scope = models.CharField(max_length=10, choices=Scope.choices)
    target = models.CharField(max_length=100, blank=True, default="")
    # db_default: a worker of the previous release, still running during a deploy, inserts
    # pauses (circuit breaker, budgets) without naming the column.
    tenant = models.CharField(
        max_length=100,
        blank=True,
        default="",
        db_default="",
        help_text="Holds only jobs whose input names this tenant; empty: every tenant.",
    )
    mode = models.CharField(max_length=10, choices=PauseMode.choices, default=PauseMode.DRAIN)
    source = models.CharField(max_length=20, choices=PauseSource.choices, default=PauseSource.MANUAL)
    reason = models.TextField()
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=[s.value for s in Scope]), name="pause_scope_valid"),
            models.CheckConstraint(condition=Q(mode__in=[m.value for m in PauseMode]), name="pause_mode_valid"),
            models.CheckConstraint(
                condition=Q(scope=Scope.GLOBAL, target="") | (~Q(scope=Scope.GLOBAL) & ~Q(target="")),
                name="pause_target_matches_scope",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="pause_has_reason"),
            # One live pause per scope and tenant: pausing twice is a clear error, not two rows to
            # lift. A tenant's pause and the every-tenant pause of one scope may both be live.
            models.UniqueConstraint(
                fields=["scope", "target", "tenant"], condition=Q(lifted_at__isnull=True), name="pause_one_live_per_scope"
            ),
        ]
        # No separate live-pause index: pause_one_live_per_scope's unique index is that same
        # (scope, target, tenant) WHERE lifted_at IS NULL index (pause_live_idx duplicated it; dropped in 0009).
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"pause {self.covers} ({self.mode})"

    @property
    def covers(self) -> str:
        """What it holds, as people read it: "everything", "queue bulk", "kind x for tenant acme"."""
        where = "everything" if self.scope == Scope.GLOBAL else f"{self.scope} {self.target}"
        return f"{where} for tenant {self.tenant}" if self.tenant else where


class BeatTask(models.Model):
    """The last tick of one beat step or app beat task, whichever replica ran it: what tells an
    operator (``koala_beat --status``) that a scheduler stopped or one of its tasks keeps failing.

    One row per task, upserted by ``workers.services.maintenance`` once per tick for all tasks
    together (``sql.BEAT_RECORD``). A success within one tick interval of the stored one is not
    written again, so any number of replicas cost about one row write per task per interval."""

    name = models.CharField(max_length=100, primary_key=True)
    beat = models.CharField(max_length=300, help_text="The beat process (host:pid) that wrote this row last.")
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_succeeded_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True, default="", help_text="The error class of the last failure.")
    consecutive_failures = models.PositiveIntegerField(default=0, help_text="Failures since the last success (any replica).")
    failures = models.PositiveBigIntegerField(default=0, help_text="Every failure recorded.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"beat task {self.name}"


class TickLease(models.Model):
    """Who runs a ``koala_tick`` task right now: taken by a conditional upsert (``sql.TICK_ACQUIRE``,
    its row count decides), renewed and checked by the work (``sql.TICK_HOLD``: the fence), cleared
    at exit. A crashed run's lease simply expires; the next run takes it."""

    name = models.CharField(max_length=100, primary_key=True)
    owner = models.CharField(max_length=300, help_text="host:pid of the run holding (or that last held) it.")
    token = models.CharField(max_length=64, help_text="The holder's random token: the fence compares it.")
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty once released.")
    released_at = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(
        max_length=200, blank=True, default="", help_text="How the last run that ended said it ended."
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"tick lease {self.name}"
