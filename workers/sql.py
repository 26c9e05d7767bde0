"""The hand-written SQL of the engine's tables, by name: every statement that reads or writes a
``workers_*`` table, the engine's own and those of the apps above it (the console's dashboard,
reviews, exports: a section each, at the end, naming its caller).

Where a statement lives: here, as a named constant with a one-line purpose, next to the why
of its shape (planner notes, lock order). Its caller (a service in workers/services/, the
ledger, the session bounds; above the engine, a selector or service of the app) executes it
and owns the transaction. A statement that touches an engine table lives here even when it
also touches an app's (``SETTLE_EXPORTS``, ``LOCK_JOB_OF_REVIEW``); one that touches only its
app's own tables lives in that app's ``sql.py`` (``exports/sql.py``, ``reviews/sql.py``), under
the rules below. tests/unit/test_sql_home.py holds every app to this. The ORM does everything
else; SQL is written by hand where one statement must decide (a conditional UPDATE whose row
count is the decision) or where the ORM would need several round trips per job.

Rules, so a reader can trust every statement at a glance:

- values are always bound parameters (``%s`` or ``%(name)s``), never formatted into the text;
- fragments shared by several statements (the live-lease fence, "a live pause covers this
  job", "this budget applies") are constants here, composed into whole statements once, when
  this module is imported: each statement's text is fixed before any request arrives (the
  ``# noqa: S608`` on those lines says so);
- text built at call time comes only from a fixed whitelist (``COUNT_RUNNING_IN_SCOPE``) or a
  repeat count (``insert_jobs``), each said where it is built;
- a caller hands the cursor ``sql.NAME`` itself (``from workers import sql``; an app's own
  home imported as, e.g., ``reviews_sql``), never a copy of its text, so the guard can follow
  the name to its home. The few exceptions (devtools' administrative SQL on the embedded
  server, statements another branch is moving) are listed with their reasons in the guard.

The one strict fence is ``HOLD_LEASE`` (``leases.hold_lease``): every attempt-side write to a
table other than ``workers_job`` runs it first in its transaction. Every write *to*
``workers_job`` on an attempt's behalf carries the same predicate, ``LIVE_LEASE``, in its WHERE.
"""

from __future__ import annotations

import re
from functools import cache

# -- the fence -------------------------------------------------------------------------------------

# The live lease of attempt (%(job_id)s, %(lease_token)s): its token is current, the job is still
# running and the lease has not expired. The one fence predicate of every attempt-side write.
#
# Planner note. Fenced writes and the claim's UPDATE find their row by primary key; their state
# checks are written ``state IS NOT DISTINCT FROM '…'`` (for this NOT NULL column it means exactly
# ``=``) because no index can serve that form. With ``=`` and statistics taken when few jobs were
# queued or running (a burst of enqueues after a quiet period, a new or truncated table),
# PostgreSQL picked job_state_created_idx (or a partial index on state) and filtered every
# queued/running row for the id, so each claim was O(queue length): 6.4 ms instead of 2.2 ms per
# claim with 5,000 queued jobs (bench/README.md).
LIVE_LEASE = (
    "id = %(job_id)s AND lease_token = %(lease_token)s AND state IS NOT DISTINCT FROM 'running' AND lease_expires_at > now()"
)

# The same fence for each row r of a batch (r.job_id, r.token): COMPLETE_MANY, HEARTBEAT_MANY.
# Both also say ``w.id = ANY(%(job_ids)s)``: joined only to a set-returning function, whose size
# the planner guesses (100 rows), the job table was read by a sequential scan whenever its
# statistics were small (a new or truncated table, a burst after a quiet period): 0.9 ms per
# completion statement at 2,000 rows and growing with the table, half the database's time in the
# live benchmark. The literal array tells the planner how few rows are wanted: primary-key lookups.
LIVE_LEASE_ROW = LIVE_LEASE.replace("%(job_id)s", "r.job_id").replace("%(lease_token)s", "r.token")

# The strict fence: lock attempt (job_id, lease_token)'s job row for the rest of the transaction,
# or return nothing. Under READ COMMITTED an ``EXISTS (…lease_token = mine…)`` inside an INSERT into
# another table is evaluated on the statement's snapshot and locks nothing: the reaper can requeue
# the job and a new attempt claim it while this transaction is still open, and its COMMIT then
# lands for a stale attempt. Locking the job row closes that window: the claim, the reaper and
# every lease transition UPDATE that row, so none of them can change it until this transaction
# ends (they skip it — FOR UPDATE SKIP LOCKED — rather than wait), and the WHERE is re-checked on
# the newest row version after any wait (EvalPlanQual). NO KEY UPDATE, not SHARE: the lock is held
# to write on the job's behalf, and it does not block inserts that reference the job (attempts,
# operations) by foreign key.
HOLD_LEASE = "SELECT 1 FROM workers_job WHERE " + LIVE_LEASE + " FOR NO KEY UPDATE"  # noqa: S608 (composed from constant fragments; values are bound)

# Why a fenced write matched no row: the job's state and current token, and whether this
# attempt's own row already holds an outcome and who requeued it (params: lease_token, job_id).
REJECTION_FOR = (
    "SELECT j.state, j.lease_token, a.outcome, a.requeued_by FROM workers_job j "
    "LEFT JOIN workers_attempt a ON a.job_id = j.id AND a.lease_token = %s WHERE j.id = %s"
)

# What a transition of a job returns, in hooks.Transition's order (transitions._transition): the
# hook is told of it and the doorbell rung for it.
_TRANSITION = "RETURNING id, kind, version, queue, state, failure_reason"

# -- pauses ------------------------------------------------------------------------------------------

# A live pause p (not lifted, not expired) covering a job whose queue, kind and tenant are {queue},
# {kind} and {tenant}: filled in below with the job row's columns or with bound parameters, never
# with values. A pause with a tenant holds only the jobs whose input names it ("tenant", the key
# budgets read too: leases.Lease.tenant); an empty one holds every tenant. With no live pause (the
# common case) the subquery finds no row and the job's input is never looked at.
_LIVE_PAUSE = (
    "p.lifted_at IS NULL AND (p.expires_at IS NULL OR p.expires_at > now()) AND "
    "(p.scope = 'global' OR (p.scope = 'queue' AND p.target = {queue}) OR (p.scope = 'kind' AND p.target = {kind})) "
    "AND (p.tenant = '' OR p.tenant = {tenant})"
)
_JOB_NOT_PAUSED = (
    "NOT EXISTS (SELECT 1 FROM workers_pause p WHERE "  # noqa: S608 (composed from constant fragments; values are bound)
    + _LIVE_PAUSE.format(queue="workers_job.queue", kind="workers_job.kind", tenant="workers_job.input->>'tenant'")
    + ")"
)

# Whether a live stop-mode pause covers a job of this kind, queue and tenant (read by every heartbeat).
STOP_REQUESTED = (
    "SELECT EXISTS (SELECT 1 FROM workers_pause p WHERE p.mode = 'stop' AND "  # noqa: S608 (composed from constant fragments; values are bound)
    + _LIVE_PAUSE.format(queue="%(queue)s", kind="%(kind)s", tenant="%(tenant)s")
    + ")"
)

# The kinds whose last N (both params) finished attempts of the past day all crashed (orphaned,
# failed fatally, or went past a per-attempt ceiling: workers.bounds, whose attempts retry with
# these error names and end memory_limit / cpu_limit), with the time of the newest crash: the
# circuit breaker's candidates.
CRASH_STREAKS = """
WITH recent AS (
    SELECT j.kind, a.finished_at,
           (a.outcome = 'orphaned' OR (a.outcome = 'failed' AND j.failure_reason = 'fatal')
            OR a.error_class IN ('MemoryLimitExceeded', 'CpuLimitExceeded')) AS crashed,
           row_number() OVER (PARTITION BY j.kind ORDER BY a.finished_at DESC, a.id DESC) AS n
    FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id
    WHERE a.finished_at > now() - interval '1 day'
      AND a.outcome IN ('succeeded', 'retry', 'failed', 'orphaned')
      AND j.kind IN (SELECT DISTINCT j2.kind FROM workers_attempt a2 JOIN workers_job j2 ON j2.id = a2.job_id
                     WHERE (a2.outcome = 'orphaned' OR (a2.outcome = 'failed' AND j2.failure_reason = 'fatal')
                            OR a2.error_class IN ('MemoryLimitExceeded', 'CpuLimitExceeded'))
                       AND a2.finished_at > now() - interval '1 day')
)
SELECT kind, max(finished_at) FROM recent WHERE n <= %s
GROUP BY kind HAVING count(*) = %s AND bool_and(crashed)
"""

# -- claims and lease transitions (workers.services.leases) ------------------------------------------

# What a claim returns, in the order of leases.Lease's fields (c = the claimed job, a = its attempt).
LEASE_COLUMNS = (
    "c.id, a.id, c.kind, c.version, c.queue, c.input, c.run_state, c.progress, c.lease_token, c.attempts, "
    "c.max_attempts, c.delivery, c.timeout_seconds, c.deadline_at, c.correlation_id, c.trace_id, c.idempotency_key, "
    "c.created_by, c.operation_key_base, c.run_id, c.step, c.steps"
)

# One statement claims the row (the conditional UPDATE whose row count decides the winner), bumps
# the fencing token and inserts the attempt, so claim and attempt commit together. {where} picks
# the job; {queued} is the picking query's state check: ``state = 'queued'`` when it must walk
# job_claim_idx in order (CLAIM_NEXT), the planner-proof form when the id is known (CLAIM_JOB).
_CLAIM = """
WITH picked AS (
    SELECT id FROM workers_job
    WHERE {where} AND {queued} AND scheduled_at <= now()
      AND (deadline_at IS NULL OR deadline_at > now())
      AND {not_paused}
    ORDER BY priority DESC, scheduled_at, id
    FOR UPDATE SKIP LOCKED
    LIMIT {limit}
), c AS (
    UPDATE workers_job j
    SET state = 'running', lease_token = j.lease_token + 1, lease_holder = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s), heartbeat_at = now(),
        attempts = j.attempts + 1, updated_at = now()
    WHERE j.id {match} AND j.state IS NOT DISTINCT FROM 'queued'
    RETURNING j.*
), a AS (
    INSERT INTO workers_attempt
        (job_id, number, worker_id, lease_token, started_at, heartbeat_at, usage, error_class, error_message)
    SELECT c.id, (SELECT count(*) FROM workers_attempt x WHERE x.job_id = c.id) + 1, %(worker)s, c.lease_token,
           now(), now(), '{{}}', '', ''
    FROM c
    RETURNING id, job_id
)
SELECT {columns} FROM c JOIN a ON a.job_id = c.id
"""

# The lease attempt %s holds (or held): the job as a Lease with the attempt's own fencing token,
# plus the attempt's worker, outcome and start. For the HTTP protocol, whose calls name the attempt.
LEASE_OF_ATTEMPT = (
    "SELECT " + LEASE_COLUMNS.replace("c.lease_token", "a.lease_token") + ", a.worker_id, a.outcome, a.started_at "
    "FROM workers_job c JOIN workers_attempt a ON a.job_id = c.id WHERE a.id = %s"
)

# Claim job %(job_id)s if it is queued, due, not paused and of a served "kind@version". It filters
# on what this worker serves exactly like CLAIM_NEXT: a doorbell can reach any worker listening on
# the queue (during a rolling deploy, one without the job's version), and a worker that claimed
# such a job could only hand it back as unservable, pushing it back by a backoff while a capable
# worker sat idle.
CLAIM_JOB = _CLAIM.format(
    where="id = %(job_id)s AND (kind || '@' || version) = ANY(%(served)s)",
    queued="state IS NOT DISTINCT FROM 'queued'",
    not_paused=_JOB_NOT_PAUSED,
    columns=LEASE_COLUMNS,
    limit="1",
    match="= (SELECT id FROM picked)",
)

# Claim the next due job of %(queue)s among the served pairs, skipping the kinds in %(skip)s.
_NEXT_IN_QUEUE = "queue = %(queue)s AND (kind || '@' || version) = ANY(%(served)s) AND kind <> ALL(%(skip)s)"
CLAIM_NEXT = _CLAIM.format(
    where=_NEXT_IN_QUEUE,
    queued="state = 'queued'",
    not_paused=_JOB_NOT_PAUSED,
    columns=LEASE_COLUMNS,
    limit="1",
    match="= (SELECT id FROM picked)",
)

# Claim up to %(n)s next due jobs of %(queue)s at once (one statement, one commit), as CLAIM_NEXT
# picks them: for a worker asking for several leases (the HTTP protocol's acquire, an RQ worker's
# batch claim), when no budget gates claims (a gated claim admits each job in its own transaction:
# leases._claim). %(batchable)s true (the RQ runtime's batch, whose jobs wait their turn) takes
# only jobs that may safely wait unstarted behind others: at_least_once with an attempt left after
# this one, so if the worker dies before starting one, the reaper requeues it (an at_most_once job
# would be failed orphaned without its body ever having run; a job on its last attempt, failed).
_BATCHABLE = "(NOT %(batchable)s OR (delivery = 'at_least_once' AND attempts + 1 < max_attempts))"
CLAIM_NEXT_MANY = _CLAIM.format(
    where=_NEXT_IN_QUEUE + " AND " + _BATCHABLE,
    queued="state = 'queued'",
    not_paused=_JOB_NOT_PAUSED,
    columns=LEASE_COLUMNS,
    limit="%(n)s",
    match="IN (SELECT id FROM picked)",
)

# The claims of an HTTP worker (api.protocol.claim_for, through leases.claim_for_worker): the
# database, not any API server process's memory, decides what the worker %(worker)s of key
# %(owner)s may take. The statement claims only pairs its row serves now (``kinds``), only from
# a queue its row names, only while the row is running and not asked to stop, and at most its
# concurrency minus the jobs it holds: the LIMIT is that room, computed in the statement. Two
# such claims for one worker through two server processes could both compute the same room, so
# the caller first locks the worker's row (LOCK_HTTP_WORKER) in the same transaction: the second
# claim waits for the first to commit, and its statement, started after the wait, sees the first
# one's leases in its own snapshot (READ COMMITTED takes one per statement). A transaction-scoped
# row lock, so PgBouncer's transaction pooling keeps it working.
_HTTP_WORKER_ROW = "w.name = %(worker)s AND w.api_key = %(owner)s AND w.stopped_at IS NULL AND w.stop_requested_at IS NULL"
_HTTP_ROOM = (
    "LEAST(%(n)s, COALESCE((SELECT greatest(w.concurrency - (SELECT count(*) FROM workers_job h "  # noqa: S608 (composed from constant fragments; values are bound)
    "WHERE h.state = 'running' AND h.lease_holder = w.name), 0) FROM workers_workerprocess w WHERE "
    + _HTTP_WORKER_ROW
    + " AND w.queues ? %(queue)s), 0))"
)
_HTTP_SERVES = (
    " AND (kind || '@' || version) = ANY(ARRAY(SELECT jsonb_array_elements_text(w.kinds) "
    "FROM workers_workerprocess w WHERE " + _HTTP_WORKER_ROW + "))"
)
CLAIM_NEXT_FOR_HTTP = _CLAIM.format(
    where=_NEXT_IN_QUEUE + _HTTP_SERVES,
    queued="state = 'queued'",
    not_paused=_JOB_NOT_PAUSED,
    columns=LEASE_COLUMNS,
    limit=_HTTP_ROOM,
    match="IN (SELECT id FROM picked)",
)

# Lock HTTP worker %(worker)s's row for the claim's transaction (see above) and read its
# concurrency, the leases it holds (as of this statement's snapshot, taken before any wait for the
# lock: a hint for the 429, never the limit), its kinds and its queues. No row: not running under
# key %(owner)s, or asked to stop.
LOCK_HTTP_WORKER = (
    "SELECT w.concurrency, (SELECT count(*) FROM workers_job h WHERE h.state = 'running' AND h.lease_holder = w.name), "  # noqa: S608 (composed from constant fragments; values are bound)
    "w.kinds, w.queues FROM workers_workerprocess w WHERE " + _HTTP_WORKER_ROW + " FOR NO KEY UPDATE OF w"
)

# After a claim by id found nothing: the queue and version of a due job of an unserved pair
# (params: live seconds, job id, served pairs), and how many live workers on its queue do and
# do not serve it.
MISDELIVERED = """
SELECT j.queue, j.version,
       count(w.name) FILTER (WHERE w.kinds ? (j.kind || '@' || j.version)),
       count(w.name) FILTER (WHERE NOT w.kinds ? (j.kind || '@' || j.version))
FROM workers_job j
LEFT JOIN workers_workerprocess w
  ON w.stopped_at IS NULL AND w.last_seen_at > now() - make_interval(secs => %s) AND w.queues ? j.queue
WHERE j.id = %s AND j.state = 'queued' AND j.scheduled_at <= now()
  AND NOT (j.kind || '@' || j.version) = ANY(%s)
GROUP BY j.id
"""

# Park a queued job that never started (a budget refused it at claim time); returns it (_TRANSITION).
PARK_QUEUED = (
    "UPDATE workers_job SET state = 'parked', park_reason = %s, park_detail = %s, parked_on = %s::jsonb, "  # noqa: S608 (composed from constant fragments; values are bound)
    "parked_at = now(), updated_at = now() WHERE id = %s AND state IS NOT DISTINCT FROM 'queued' " + _TRANSITION
)

# The job %s's earlier unservable attempts (the backoff of the next one grows with them).
COUNT_UNSERVABLE = "SELECT count(*) FROM workers_attempt WHERE job_id = %s AND outcome = 'unservable'"

# Extend attempt (job_id, lease_token)'s lease and store its progress checkpoint, fenced.
HEARTBEAT = f"""
WITH j AS (
    UPDATE workers_job
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), heartbeat_at = now(),
        progress = COALESCE(%(progress)s::jsonb, progress), updated_at = now()
    WHERE {LIVE_LEASE}
    RETURNING id
)
UPDATE workers_attempt SET heartbeat_at = now()
WHERE job_id = (SELECT id FROM j) AND lease_token = %(lease_token)s
RETURNING id
"""  # noqa: S608 (composed from constant fragments; values are bound)

# Add the numeric usage in %(usage)s (a JSON object: tokens, cost_minor, …) to the usage column of
# the row being updated, key by key: ``usage = usage || (…)``. The subquery's ``usage`` is the
# updated row's column (its own FROM has only u(k, v)).
_ADD_USAGE = (
    "usage || (SELECT COALESCE(jsonb_object_agg(k, COALESCE((usage->>k)::numeric, 0) + v::numeric), '{}') "
    "FROM jsonb_each_text(%(usage)s::jsonb) AS u(k, v))"
)

# The job's tenant as Lease.tenant reads it: the input's "tenant" when it is a string, else ''.
_JOB_TENANT = "CASE WHEN jsonb_typeof(input->'tenant') = 'string' THEN input->>'tenant' ELSE '' END"

# The end of both attempt-ending statements (_FINISH, _COMPLETE_MANY), after their ``j`` (the jobs
# moved) and ``a`` (the attempts finished): the run time of each attempt is added to the usage rows
# of the budgets that count run time or attempts for its kind, queue and tenant, in the period its
# claim counted it in. The rows are locked in id order first; the seconds are summed per usage row
# (UPDATE … FROM applies one joined row per target row, so two attempts of one batch counted on the
# same row must be added before the join). Returns what the transition hook is told. No braces: it
# is joined into templates that .format() fills.
_ADD_RUN_TIME = """), locked AS (
    SELECT u.id, EXTRACT(EPOCH FROM now() - a.started_at) AS seconds
    FROM a JOIN j ON j.id = a.job_id, workers_budgetusage u JOIN workers_budget b ON b.id = u.budget_id
    WHERE (b.run_seconds_limit IS NOT NULL OR b.attempt_limit IS NOT NULL)
      AND (b.scope = 'global' OR (b.scope = 'queue' AND b.target = j.queue) OR (b.scope = 'kind' AND b.target = j.kind))
      AND (b.tenant = '' OR b.tenant = j.tenant)
      AND u.period = (a.started_at AT TIME ZONE b.timezone)::date
    ORDER BY u.id
    FOR UPDATE OF u
), run AS (
    UPDATE workers_budgetusage u SET run_seconds = u.run_seconds + l.seconds, updated_at = now()
    FROM (SELECT id, sum(seconds) AS seconds FROM locked GROUP BY id) l WHERE u.id = l.id
)
SELECT j.id, j.kind, j.version, j.queue, j.state, j.failure_reason FROM j JOIN a ON a.job_id = j.id
"""

# An attempt's end: one fenced statement moves the job ({job_set}, then the lease is cleared and
# the reported usage added), finishes the attempt's row with its outcome, error, timings and usage,
# and adds the attempt's run time (the database's clock, from its claim to now) to the budgets that
# count run time or attempts for the job's kind, queue and tenant, on the usage row of the period
# its claim counted the attempt in (the claim's day in each budget's zone). Whichever kind of worker
# ran the attempt, its run time is counted the same way, inside the same commit as its end. The
# usage rows are locked in id order first (``locked``), the order every statement that locks
# several of them keeps (budgets.reserve, settle, admit_claim), so two endings and a reservation
# cannot deadlock. Returns what the transition hook is told (workers.hooks.Transition). The
# placeholders are filled below, once, with LIVE_LEASE and one constant SET list per transition.
_FINISH = (
    """
WITH j AS (
    UPDATE workers_job
    SET {job_set}, lease_holder = NULL, lease_expires_at = NULL, updated_at = now(), usage = {add_usage}
    WHERE {fence}
    RETURNING id, kind, version, queue, state, failure_reason, {tenant} AS tenant
), a AS (
    UPDATE workers_attempt
    SET outcome = %(outcome)s, finished_at = now(), error_class = %(error_class)s, error_message = %(error_message)s,
        compute_seconds = %(compute_seconds)s, db_wait_seconds = %(db_wait_seconds)s,
        storage_wait_seconds = %(storage_wait_seconds)s, usage = {add_usage}
    WHERE job_id = (SELECT id FROM j) AND lease_token = %(lease_token)s
    RETURNING id, job_id, started_at
"""  # noqa: S608 (composed from constant fragments; values are bound)
    + _ADD_RUN_TIME
)


def _finish(job_set: str) -> str:
    """One transition's end-of-attempt statement: _FINISH with its SET list (a constant below)."""
    return _FINISH.format(job_set=job_set, fence=LIVE_LEASE, add_usage=_ADD_USAGE, tenant=_JOB_TENANT)


# Succeeded: store the result, merge the state delta into run_state by top-level key.
COMPLETE = _finish(
    "state = 'succeeded', result = %(result)s::jsonb, run_state = run_state || %(state_delta)s::jsonb, finished_at = now()",
)

# A retryable failure within the attempt budget: queued again after %(delay_seconds)s.
RETRY_LATER = _finish(
    "state = 'queued', scheduled_at = now() + make_interval(secs => %(delay_seconds)s), "
    "error_class = %(error_class)s, error_message = %(error_message)s",
)

# A terminal outcome: failed with %(reason)s.
FAIL = _finish(
    "state = 'failed', failure_reason = %(reason)s, error_class = %(error_class)s, "
    "error_message = %(error_message)s, finished_at = now()",
)

# Set aside (review, needs attention, budget), giving the attempt back.
PARK = _finish(
    "state = 'parked', attempts = attempts - 1, park_reason = %(reason)s, park_detail = %(detail)s, "
    "parked_on = %(parked_on)s::jsonb, parked_at = now()",
)

# Back to the queue without using an attempt (shutdown, a stop pause, an unservable kind, a wait to reconcile).
RELEASE = _finish(
    "state = 'queued', attempts = attempts - 1, scheduled_at = now() + make_interval(secs => %(delay_seconds)s)",
)

# Succeeded, for a batch of attempts at once (transitions.end_attempts): COMPLETE's effect on
# every row of %(rows)s (a JSON array of {job_id, lease_token, result, state_delta, usage,
# compute_seconds, db_wait_seconds, storage_wait_seconds}) in one statement. Each row is fenced by
# its own (job_id, lease_token) exactly as LIVE_LEASE fences one: a row whose lease was lost
# matches nothing and is left out of what the statement returns, without touching the others
# (the caller asks rejection_for about each missing one). The run time added to budgets is summed
# per usage row (``run``): UPDATE … FROM applies one joined row per target row, so two attempts
# counted on the same usage row must be added before the join.
_COMPLETE_MANY = (
    """
WITH r AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
        job_id bigint, token bigint, result jsonb, state_delta jsonb, add_usage jsonb,
        compute_seconds float8, db_wait_seconds float8, storage_wait_seconds float8)
), j AS (
    UPDATE workers_job w
    SET state = 'succeeded', result = COALESCE(r.result, 'null'::jsonb), run_state = w.run_state || r.state_delta,
        finished_at = now(),
        lease_holder = NULL, lease_expires_at = NULL, updated_at = now(), usage = {job_usage}
    FROM r
    WHERE w.id = ANY(%(job_ids)s::bigint[]) AND {fence}
    RETURNING w.id, w.kind, w.version, w.queue, w.state, w.failure_reason, {tenant} AS tenant, r.token
), a AS (
    UPDATE workers_attempt x
    SET outcome = 'succeeded', finished_at = now(), error_class = '', error_message = '',
        compute_seconds = r.compute_seconds, db_wait_seconds = r.db_wait_seconds,
        storage_wait_seconds = r.storage_wait_seconds, usage = {attempt_usage}
    FROM j JOIN r ON r.job_id = j.id
    WHERE x.job_id = j.id AND x.lease_token = j.token
    RETURNING x.id, x.job_id, x.started_at
"""  # noqa: S608 (composed from constant fragments; values are bound)
    + _ADD_RUN_TIME
)
COMPLETE_MANY = _COMPLETE_MANY.format(
    job_usage=_ADD_USAGE.replace("%(usage)s::jsonb", "r.add_usage")
    .replace("(usage->>k)", "(w.usage->>k)")
    .replace("usage ||", "w.usage ||"),
    attempt_usage=_ADD_USAGE.replace("%(usage)s::jsonb", "r.add_usage")
    .replace("(usage->>k)", "(x.usage->>k)")
    .replace("usage ||", "x.usage ||"),
    tenant=_JOB_TENANT.replace("input", "w.input"),
    fence=LIVE_LEASE_ROW,
)

# Extend the leases of attempts %(job_ids)s / %(tokens)s (parallel arrays) that are still live, each
# fenced by its own token: the leases an RQ worker holds for jobs of its batch that wait their turn
# (or whose completion waits for the batch's end). Returns the job ids still held.
HEARTBEAT_MANY = (
    "UPDATE workers_job w SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), heartbeat_at = now() "  # noqa: S608 (composed from constant fragments; values are bound)
    "FROM unnest(%(job_ids)s::bigint[], %(tokens)s::bigint[]) AS r(job_id, token) "
    "WHERE w.id = ANY(%(job_ids)s::bigint[]) AND " + LIVE_LEASE_ROW + " RETURNING w.id"
)

# -- the beat (workers.services.maintenance) ---------------------------------------------------------

# Mark the attempt of every expired lease orphaned. Each reaping statement takes its jobs FOR
# UPDATE SKIP LOCKED: a job whose row a stalled attempt (or another beat replica) has locked is
# left for a later tick instead of waited for, so neither a partitioned worker nor a partitioned
# beat can stall the reaper. The locks last until COMMIT, so the next two statements act on the
# rows this one orphaned, and a concurrent replica skips them.
REAP_ORPHAN_ATTEMPTS = """
WITH expired AS (
    SELECT id, lease_token, lease_expires_at FROM workers_job
    WHERE state = 'running' AND lease_expires_at < now()
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE workers_attempt a
SET outcome = 'orphaned', finished_at = now(),
    error_message = 'lease expired at '
        || to_char(j.lease_expires_at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ' without a report'
FROM expired j
WHERE a.job_id = j.id AND a.lease_token = j.lease_token AND a.finished_at IS NULL
"""

# Requeue at_least_once jobs whose lease expired more than %s (grace) seconds ago, with attempts
# and time left; returns them (_TRANSITION) for the hook and the doorbell.
REAP_REQUEUE = (
    """
UPDATE workers_job
SET state = 'queued', scheduled_at = now(), lease_holder = NULL, lease_expires_at = NULL, updated_at = now(),
    error_class = 'LeaseExpired', error_message = 'the previous attempt''s lease expired; requeued'
WHERE id IN (
    SELECT id FROM workers_job
    WHERE state = 'running' AND lease_expires_at < now() - make_interval(secs => %s)
      AND delivery = 'at_least_once' AND attempts < max_attempts
      AND (deadline_at IS NULL OR deadline_at > now())
    FOR NO KEY UPDATE SKIP LOCKED
) AND state = 'running'
"""  # noqa: S608 (composed from constant fragments; values are bound)
    + _TRANSITION
)

# Fail (orphaned) every other job whose lease expired more than %s (grace) seconds ago (_TRANSITION).
REAP_FAIL = (
    """
UPDATE workers_job
SET state = 'failed', failure_reason = 'orphaned', lease_holder = NULL, lease_expires_at = NULL,
    finished_at = now(), updated_at = now(), error_class = 'LeaseExpired',
    error_message = CASE WHEN delivery = 'at_most_once'
        THEN 'lease expired; at_most_once does not run a body twice'
        ELSE 'lease expired and no attempts or time remain' END
WHERE id IN (
    SELECT id FROM workers_job
    WHERE state = 'running' AND lease_expires_at < now() - make_interval(secs => %s)
    FOR NO KEY UPDATE SKIP LOCKED
) AND state = 'running'
"""  # noqa: S608 (composed from constant fragments; values are bound)
    + _TRANSITION
)

# Fail (deadline_exceeded) queued jobs whose overall deadline passed before they ran (_TRANSITION).
FAIL_PAST_DEADLINE = (
    """
UPDATE workers_job
SET state = 'failed', failure_reason = 'deadline_exceeded', finished_at = now(), updated_at = now(),
    error_class = 'DeadlineExceeded', error_message = 'the job''s overall deadline passed before it ran'
WHERE id IN (
    SELECT id FROM workers_job
    WHERE state = 'queued' AND deadline_at IS NOT NULL AND deadline_at <= now()
    FOR NO KEY UPDATE SKIP LOCKED
) AND state = 'queued'
"""  # noqa: S608 (composed from constant fragments; values are bound)
    + _TRANSITION
)

# The queues with queued jobs, then each queue's first %s due, unpaused jobs in claim order (the
# dispatcher rings for them; it does not wake workers for jobs a live pause holds back).
#
# Planner note. ``SELECT DISTINCT queue FROM workers_job WHERE state = 'queued'`` reads every
# queued row (an index-only scan of all of job_claim_idx: 76 ms with 200k queued jobs, on every
# beat tick). PostgreSQL 15 has no skip scan, so the recursive CTE does one by hand (a "loose
# index scan"): each step asks job_claim_idx, whose leading column is queue, for the first
# queue after the previous one, one index descent per queue: O(queues * log rows).
# The due check stays in the LATERAL, exactly where it was: a queue whose jobs are all
# delayed yields no row there, as it yielded none from the DISTINCT before.
DISPATCH_DUE = (
    """
WITH RECURSIVE queues(queue) AS (
    (SELECT queue FROM workers_job WHERE state = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM workers_job j WHERE j.state = 'queued' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
)
SELECT q.queue, d.id, d.version
FROM queues q
CROSS JOIN LATERAL (
    SELECT id, version FROM workers_job
    WHERE state = 'queued' AND queue = q.queue AND scheduled_at <= now() AND """  # noqa: S608 (composed from constant fragments; values are bound)
    + _JOB_NOT_PAUSED
    + """
    ORDER BY priority DESC, scheduled_at, id LIMIT %s
) d
WHERE q.queue IS NOT NULL
"""
)

# -- the beat's last tick per task (workers.services.maintenance, workers.selectors.beat) ------------

# Each tick's outcome for every task it ran, in one statement (arrays unnested: one round trip
# per tick, however many tasks). A failure always lands (counted, its error class kept); a
# success lands only if the stored row is older than %(gap)s seconds (the tick interval) or was
# failing: with N replicas a task's row is written about once per interval, not N times.
# The last error stays after a success (with last_failed_at), so a flapping task is visible.
BEAT_RECORD = """
INSERT INTO workers_beattask AS b (name, beat, last_started_at, last_finished_at, last_succeeded_at, last_failed_at,
                                   last_error, consecutive_failures, failures)
SELECT t.name, %(beat)s, t.started, t.finished,
       CASE WHEN t.error = '' THEN t.finished END, CASE WHEN t.error <> '' THEN t.finished END,
       t.error, (t.error <> '')::int, (t.error <> '')::int
FROM unnest(%(names)s::text[], %(started)s::timestamptz[], %(finished)s::timestamptz[], %(errors)s::text[])
     AS t(name, started, finished, error)
ON CONFLICT (name) DO UPDATE SET
    beat = EXCLUDED.beat,
    last_started_at = EXCLUDED.last_started_at,
    last_finished_at = EXCLUDED.last_finished_at,
    last_succeeded_at = COALESCE(EXCLUDED.last_succeeded_at, b.last_succeeded_at),
    last_failed_at = COALESCE(EXCLUDED.last_failed_at, b.last_failed_at),
    last_error = CASE WHEN EXCLUDED.last_error <> '' THEN EXCLUDED.last_error ELSE b.last_error END,
    consecutive_failures = CASE WHEN EXCLUDED.last_error <> '' THEN b.consecutive_failures + 1 ELSE 0 END,
    failures = b.failures + EXCLUDED.failures
WHERE EXCLUDED.last_error <> '' OR b.consecutive_failures > 0 OR b.last_finished_at IS NULL
   OR b.last_finished_at <= EXCLUDED.last_finished_at - %(gap)s * interval '1 second'
"""

# Claim a task shared by the replicas (retention: one pass per interval in all, not one per
# replica): the row count decides. It starts the run (last_started_at, by this beat's clock, as
# BEAT_RECORD's times are) only if no replica started it within %(every)s seconds.
BEAT_CLAIM = """
INSERT INTO workers_beattask AS b (name, beat, last_started_at, last_error, consecutive_failures, failures)
VALUES (%(name)s, %(beat)s, %(now)s, '', 0, 0)
ON CONFLICT (name) DO UPDATE SET beat = EXCLUDED.beat, last_started_at = EXCLUDED.last_started_at
WHERE b.last_started_at IS NULL OR b.last_started_at <= EXCLUDED.last_started_at - %(every)s * interval '1 second'
"""

# -- timer-started housekeeping (workers.services.ticks) ----------------------------------------

# Take a task's lease if nobody holds it (never taken, released, or expired: a crashed run's):
# the row count decides. The CTE reads the row as it was before this statement, so the caller
# learns whether the previous run ended (released) or crashed (expired unreleased), and by whom.
TICK_ACQUIRE = """
WITH previous AS (SELECT owner, expires_at, released_at, last_outcome FROM workers_ticklease WHERE name = %(name)s)
INSERT INTO workers_ticklease AS l (name, owner, token, acquired_at, expires_at, released_at, last_outcome)
VALUES (%(name)s, %(owner)s, %(token)s, now(), now() + %(seconds)s * interval '1 second', NULL, '')
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, acquired_at = EXCLUDED.acquired_at,
    expires_at = EXCLUDED.expires_at, released_at = NULL
WHERE l.expires_at IS NULL OR l.expires_at <= now()
RETURNING (SELECT owner FROM previous), (SELECT expires_at FROM previous),
          (SELECT released_at FROM previous), (SELECT last_outcome FROM previous)
"""

# Who holds a task's lease now (asked after a refused TICK_ACQUIRE, for the message).
TICK_HOLDER = """
SELECT owner, acquired_at, expires_at FROM workers_ticklease WHERE name = %(name)s
"""

# The fence: the run still holds its lease (same token, not expired) and extends it by
# %(seconds)s; no row means another run took it after it expired, and this run must stop.
TICK_HOLD = """
UPDATE workers_ticklease SET expires_at = now() + %(seconds)s * interval '1 second'
WHERE name = %(name)s AND token = %(token)s AND expires_at > now()
"""

# Release at exit, recording how the run ended; only by the holder (a fenced-out run changes nothing).
TICK_RELEASE = """
UPDATE workers_ticklease SET expires_at = NULL, released_at = now(), last_outcome = %(outcome)s
WHERE name = %(name)s AND token = %(token)s
"""

# -- jobs (workers.services.jobs) ----------------------------------------------------------------------

# The columns of an enqueued job: the caller's values first (one bound value each, in
# jobs._Row's order), then the constants every new job starts with (JOB_ROW's literals).
JOB_INSERT_COLUMNS = (
    "kind, version, queue, input, input_fingerprint, idempotency_key, priority, delivery, scheduled_at, deadline_at, "
    "max_attempts, timeout_seconds, correlation_id, trace_id, created_by, created_at, updated_at, "
    "run_id, step, steps, run_state, operation_key_base, "
    "state, attempts, lease_token, progress, usage, error_class, error_message, park_detail, parked_on"
)
JOB_ROW = (
    "(%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s::jsonb, %s::jsonb, %s, "
    "'queued', 0, 0, '{}', '{}', '', '', '', '{}')"
)


@cache
def insert_jobs(rows: int) -> str:
    """Insert ``rows`` jobs (a key already used for the kind skips its row); returns (trace_id, id)
    of the inserted ones. Built at call time only in this way: JOB_ROW, a constant, ``rows`` times."""
    if not 1 <= rows <= 500:
        raise ValueError("insert_jobs takes 1..500 rows (enqueue_many sends chunks of 500)")
    return (
        f"INSERT INTO workers_job ({JOB_INSERT_COLUMNS}) VALUES {', '.join([JOB_ROW] * rows)} "  # noqa: S608 (a constant row, repeated)
        "ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING "
        "RETURNING trace_id, id"
    )


# An app's in-transaction hook refuses a completion that has just landed (a workflow step whose
# state delta would make its run's state too large): in the same transaction as sql.COMPLETE, the
# job and its attempt end failed (terminal) instead, so nobody ever sees the success. Params:
# error_class, error_message, job_id. Returns _TRANSITION's columns when it changed the job.
REFUSE_COMPLETION = (
    "WITH j AS (UPDATE workers_job SET state = 'failed', failure_reason = 'terminal', result = NULL, "
    "error_class = %(error_class)s, error_message = %(error_message)s, updated_at = now() "
    "WHERE id = %(job_id)s AND state = 'succeeded' "
    "RETURNING id, kind, version, queue, state, failure_reason, lease_token), "
    "a AS (UPDATE workers_attempt SET outcome = 'failed', error_class = %(error_class)s, error_message = %(error_message)s "
    "WHERE job_id = (SELECT id FROM j) AND lease_token = (SELECT lease_token FROM j) AND outcome = 'succeeded' RETURNING id) "
    "SELECT id, kind, version, queue, state, failure_reason FROM j"
)

# The job holding a kind's idempotency key, and its input's fingerprint (params: kind, key).
JOB_BY_KEY = "SELECT id, input_fingerprint FROM workers_job WHERE kind = %s AND idempotency_key = %s"

# Queue again the jobs among %s still parked for reason %s; returns them (_TRANSITION) for the hook and the doorbell.
UNPARK_JOBS = (
    "UPDATE workers_job SET state = 'queued', park_reason = NULL, park_detail = '', parked_on = '{}'::jsonb, "  # noqa: S608 (composed from constant fragments; values are bound)
    "parked_at = NULL, scheduled_at = now(), updated_at = now() "
    "WHERE id = ANY(%s) AND state = 'parked' AND park_reason = %s " + _TRANSITION
)

# -- budgets (workers.services.budgets) ----------------------------------------------------------------

# Budget b applies to a job of %(kind)s, %(queue)s and %(tenant)s.
_BUDGET_APPLIES = (
    "(b.scope = 'global' OR (b.scope = 'queue' AND b.target = %(queue)s) OR (b.scope = 'kind' AND b.target = %(kind)s))"
    " AND (b.tenant = '' OR b.tenant = %(tenant)s)"
)
# Today, in budget b's own time zone: the period its usage row counts.
_BUDGET_PERIOD = "(now() AT TIME ZONE b.timezone)::date"

# A budget row's columns, as the model has them (for Budget.objects.raw). Named, not b.*: a column
# the model no longer has (currency, kept for the previous release's workers until a later
# migration drops it) would be set on each row as an attribute, and Budget.currency is a property.
BUDGET_COLUMNS = (
    "b.id, b.name, b.scope, b.target, b.tenant, b.timezone, b.spend_limit_minor, b.request_limit, b.concurrency_limit, "
    "b.run_seconds_limit, b.attempt_limit, b.pause_on_exhaust, b.created_by, b.created_at, b.updated_at"
)

# The budgets that cover a job of this kind, queue and tenant, in id order (whole rows, for Budget.objects.raw).
APPLICABLE_BUDGETS = "SELECT " + BUDGET_COLUMNS + " FROM workers_budget b WHERE " + _BUDGET_APPLIES + " ORDER BY b.id"  # noqa: S608 (composed from constant fragments; values are bound)

# Lock order. A reservation, a claim's attempt count, a settlement and a release each lock
# several usage rows (one per budget that applies), and the sets of two workers' jobs overlap
# (global + queue + kind + tenant). Taken in different orders, each can hold a row the other
# waits for, and PostgreSQL aborts one with deadlock_detected after deadlock_timeout. So every
# statement that locks usage rows takes them in usage id order (_LOCK_USAGE, or one row per
# statement sorted by id in workers.services.budgets), and a multi-row UPDATE only touches rows
# its own CTE already locked: the order of an UPDATE … FROM follows the plan (a hash join walks
# the heap, whose order every update reshuffles), not ids. New rows are inserted in budget id
# order: inserting a key that another transaction's uncommitted insert holds waits for it too.

# Create this period's usage rows of the budgets {where} selects; returns (budget id, name, period).
_ENSURE_USAGE = """
WITH b AS (SELECT b.id, b.name, {period} AS period FROM workers_budget b WHERE {where}),
ins AS (
    INSERT INTO workers_budgetusage
        (budget_id, period, spent_minor, reserved_minor, requests, attempts, run_seconds, updated_at)
    SELECT id, period, 0, 0, 0, 0, 0, now() FROM b ORDER BY id
    ON CONFLICT (budget_id, period) DO NOTHING
)
SELECT id, name, period FROM b ORDER BY id
"""
# … of the budgets that apply to a job of %(kind)s, %(queue)s and %(tenant)s.
ENSURE_USAGE_APPLICABLE = _ENSURE_USAGE.format(period=_BUDGET_PERIOD, where=_BUDGET_APPLIES)
# … of the budgets whose ids are in %(ids)s.
ENSURE_USAGE_BY_ID = _ENSURE_USAGE.format(period=_BUDGET_PERIOD, where="b.id = ANY(%(ids)s)")

# Lock, in id order, this period's usage rows of the budgets {where} selects (a CTE named locked,
# for the UPDATE that follows it). A CTE with FOR UPDATE is never folded into its query; its
# LockRows runs above the sort, so the rows are locked in id order whatever the UPDATE's plan.
_LOCK_USAGE = (
    "WITH locked AS (SELECT u.id FROM workers_budgetusage u JOIN workers_budget b ON b.id = u.budget_id "  # noqa: S608 (composed from constant fragments; values are bound)
    "WHERE u.period = " + _BUDGET_PERIOD + " AND {where} ORDER BY u.id FOR UPDATE OF u)"
)

# Reserve %(est)s and one request on every applicable budget with room; returns (usage id, budget id)
# of each granted row. The conditional UPDATE is the decision: PostgreSQL re-checks each row's
# condition on its newest version (it waited for the lock in the CTE), so two workers racing for
# the last unit cannot both pass.
RESERVE = (
    _LOCK_USAGE.format(where=_BUDGET_APPLIES)
    + """
UPDATE workers_budgetusage u
SET reserved_minor = u.reserved_minor + %(est)s, requests = u.requests + 1, updated_at = now()
FROM workers_budget b, locked
WHERE u.id = locked.id AND u.budget_id = b.id
  AND (b.spend_limit_minor IS NULL OR u.spent_minor + u.reserved_minor + %(est)s <= b.spend_limit_minor)
  AND (b.request_limit IS NULL OR u.requests + 1 <= b.request_limit)
RETURNING u.id, u.budget_id
"""
)

# Turn a reservation (params: reserved, actual cost, usage id) into spend; returns the budget id.
SETTLE_RESERVATION = (
    "UPDATE workers_budgetusage SET reserved_minor = GREATEST(reserved_minor - %s, 0), "
    "spent_minor = spent_minor + %s, updated_at = now() WHERE id = %s RETURNING budget_id"
)

# Give a reservation back (params: reserved, requests to refund (0 or 1), usage id): the call did not happen.
RELEASE_RESERVATION = (
    "UPDATE workers_budgetusage SET reserved_minor = GREATEST(reserved_minor - %s, 0), "
    "requests = GREATEST(requests - %s, 0), updated_at = now() WHERE id = %s"
)

# The budgets a claim must check: id, name, scope, target, tenant, concurrency limit, and whether
# it counts attempts or run time.
CLAIM_BUDGETS = (
    "SELECT b.id, b.name, b.scope, b.target, b.tenant, b.concurrency_limit, "
    "b.attempt_limit IS NOT NULL OR b.run_seconds_limit IS NOT NULL "
    "FROM workers_budget b WHERE " + _BUDGET_APPLIES + " ORDER BY b.id"
)

# Lock the concurrency-limited budgets whose ids are in %s, in id order: claims in one
# concurrency scope take turns on the budget row.
LOCK_BUDGETS = "SELECT id FROM workers_budget WHERE id = ANY(%s) ORDER BY id FOR UPDATE"

# The running jobs in a budget's concurrency scope (%(target)s; %(tenant)s when the budget has
# one), keyed by (scope, has a tenant). Built once from these two fixed whitelists, not per call.
_SCOPE_FILTER = {"global": "TRUE", "queue": "queue = %(target)s", "kind": "kind = %(target)s"}
_TENANT_FILTER = {False: "", True: "AND input->>'tenant' = %(tenant)s"}
COUNT_RUNNING_IN_SCOPE = {
    (scope, by_tenant): f"SELECT count(*) FROM workers_job WHERE state = 'running' AND {scope_sql} {tenant_sql}"  # noqa: S608 (fragments from the two whitelists above)
    for scope, scope_sql in _SCOPE_FILTER.items()
    for by_tenant, tenant_sql in _TENANT_FILTER.items()
}

# Count one attempt on each budget in %(ids)s with attempts and run time left; returns (usage id, budget id).
COUNT_CLAIM_ATTEMPT = (
    _LOCK_USAGE.format(where="b.id = ANY(%(ids)s)")
    + """
UPDATE workers_budgetusage u SET attempts = u.attempts + 1, updated_at = now()
FROM workers_budget b, locked
WHERE u.id = locked.id AND u.budget_id = b.id
  AND (b.attempt_limit IS NULL OR u.attempts < b.attempt_limit)
  AND (b.run_seconds_limit IS NULL OR u.run_seconds < b.run_seconds_limit)
RETURNING u.id, u.budget_id
"""
)


# -- the operations ledger (workers.ledger) ----------------------------------------------------------

# Each ledger UPDATE of an operation row runs after HOLD_LEASE in the same transaction, and names
# the row by %(op)s. %(any_holder)s false: only if the attempt that marked it in flight still
# holds it (lease_token = %(token)s); true: whichever attempt of this job left it (a reconcile,
# a question to a person). Zero rows: the row itself moved on (another job with the same key, a
# person's resolution), never to be overwritten.
_OPERATION_ROW = " updated_at = now() WHERE id = %(op)s AND (%(any_holder)s OR lease_token = %(token)s)"

# The outcome is open (a timeout, a crash, an unreconcilable answer): say why in %(msg)s.
OPERATION_UNCERTAIN = "UPDATE workers_operation SET state = 'uncertain', error_message = %(msg)s," + _OPERATION_ROW  # noqa: S608 (composed from constant fragments; values are bound)

# Reconcile proved the call absent: failed, resolution absent, reservations released.
OPERATION_PROVEN_ABSENT = (
    "UPDATE workers_operation SET state = 'failed', resolution = 'absent', reservations = '[]'::jsonb, "  # noqa: S608 (composed from constant fragments; values are bound)
    "error_message = %(msg)s," + _OPERATION_ROW
)

# The call happened (succeeded, or reconciled as found): store the result, cost and usage. A re-send
# after reconcile proved the first absent keeps that history (resolution absent).
OPERATION_SUCCEEDED = (
    "UPDATE workers_operation SET state = %(state)s, "  # noqa: S608 (composed from constant fragments; values are bound)
    "resolution = CASE WHEN %(resolution)s = '' THEN resolution ELSE %(resolution)s END, "
    "external_id = %(ext)s, response = %(resp)s::jsonb, result = %(result)s::jsonb, cost_minor = %(cost)s, "
    "overshoot_minor = %(over)s, usage = %(usage)s::jsonb, reservations = '[]'::jsonb, error_message = '', "
    "settled_at = now()," + _OPERATION_ROW
)

# The provider definitely did not act (not performed, declined): failed, safe to re-send.
OPERATION_NOT_DONE = (
    "UPDATE workers_operation SET state = 'failed', reservations = '[]'::jsonb, error_message = %(msg)s, "  # noqa: S608 (composed from constant fragments; values are bound)
    "settled_at = now()," + _OPERATION_ROW
)

# What a settled operation counted (its cost and numeric usage, %(usage)s) added to attempt
# (job_id, lease_token)'s job and to the attempt's own row, fenced, in the ledger's settlement
# transaction: spent money is on the job the moment it is recorded, whichever kind of worker made
# the call and whether or not the attempt later reports.
ADD_OPERATION_USAGE = f"""
WITH j AS (
    UPDATE workers_job SET usage = {_ADD_USAGE}, updated_at = now()
    WHERE {LIVE_LEASE}
    RETURNING id
)
UPDATE workers_attempt SET usage = {_ADD_USAGE}
WHERE job_id = (SELECT id FROM j) AND lease_token = %(lease_token)s
RETURNING id
"""  # noqa: S608 (composed from constant fragments; values are bound)

# Seconds (database clock) since the last send under operation %s can have left: the end of the
# lease of the attempt that marked it in flight (or the row's last write, without an attempt row).
SECONDS_SINCE_LAST_SEND = (
    "SELECT EXTRACT(EPOCH FROM now() - CASE WHEN a.id IS NULL THEN o.updated_at "
    "ELSE GREATEST(a.started_at, a.heartbeat_at, COALESCE(a.finished_at, now())) END) "
    "FROM workers_operation o LEFT JOIN workers_attempt a ON a.id = o.attempt_id WHERE o.id = %s"
)

# Record a first send as in flight (its key unused so far); returns its id, or nothing when the
# key is another job's.
INSERT_OPERATION = """
INSERT INTO workers_operation
    (job_id, attempt_id, lease_token, name, key, kind, fingerprint, params, state, resolution,
     external_id, response, result, amount_minor, currency, target, estimate_minor, cost_minor, usage,
     reservations, error_message, attempts, created_at, updated_at, settled_at)
SELECT %(job)s, %(attempt)s, %(token)s, %(name)s, %(key)s, %(kind)s, %(fp)s, %(params)s::jsonb,
       'in_flight', '', '', '{}', NULL, %(amount)s, %(currency)s, %(target)s, %(est)s, NULL, '{}',
       %(res)s::jsonb, '', 1, now(), now(), NULL
ON CONFLICT (key) DO NOTHING
RETURNING id
"""

# Record a re-send of failed operation %(op)s as in flight, for this attempt.
RESEND_OPERATION = """
UPDATE workers_operation
SET state = 'in_flight', attempt_id = %(attempt)s, lease_token = %(token)s, reservations = %(res)s::jsonb,
    estimate_minor = %(est)s, attempts = attempts + 1, error_message = '', updated_at = now()
WHERE id = %(op)s AND state = 'failed'
"""

# -- people settling an operation (workers.services.operations) ------------------------------------

# Lock the job of operation %s (the job row first, then its operation: the ledger's lock order);
# returns its id, state and park reason.
LOCK_JOB_OF_OPERATION = (
    "SELECT j.id, j.state, j.park_reason FROM workers_job j JOIN workers_operation o ON o.job_id = j.id "
    "WHERE o.id = %s FOR UPDATE OF j"
)

# A person settles an open operation as happened or not. An operation may be settled by a person
# only while no attempt can act on it: its job parked needing attention, or finished (a cancelled
# or failed job's open operation would otherwise hold its budget reservation for ever). A queued
# or running job's attempt reconciles and settles the operation itself; a person's resolution
# would race it (two settlements of the same reservations, or "did not happen" recorded while the
# attempt sees it happen). Params: state, resolution, happened, proof, happened, result, happened,
# message, operation id.
RESOLVE_OPERATION = """
UPDATE workers_operation o SET state = %s, resolution = %s,
    external_id = CASE WHEN %s THEN %s ELSE o.external_id END,
    result = CASE WHEN %s THEN %s::jsonb ELSE o.result END,
    cost_minor = CASE WHEN %s THEN o.estimate_minor ELSE o.cost_minor END,
    reservations = '[]'::jsonb, error_message = %s, settled_at = now(), updated_at = now()
FROM workers_job j
WHERE o.id = %s AND j.id = o.job_id AND o.state IN ('in_flight', 'uncertain')
  AND ((j.state = 'parked' AND j.park_reason = 'needs_attention') OR j.state IN ('succeeded', 'failed', 'cancelled'))
"""

# -- retention (workers.services.retention, workers.selectors.retention) ------------------------------

# What makes a finished job prunable, besides its age: no operation of its is open (in flight or
# uncertain: an outcome nobody knows yet must stay, and its job with it), and no job retrying it
# (retry_of) is live or young (the retry carries the original's operation keys and links to it).
# %(cutoff)s is now() - KOALA_RETENTION_DAYS, computed once by the caller.
_PRUNABLE = """
j.finished_at < %(cutoff)s
AND j.state IN ('succeeded', 'failed', 'cancelled')
AND NOT EXISTS (SELECT 1 FROM workers_operation o WHERE o.job_id = j.id AND o.state IN ('in_flight', 'uncertain'))
AND NOT EXISTS (
    SELECT 1 FROM workers_job r WHERE r.retry_of_id = j.id
    AND NOT (r.state IN ('succeeded', 'failed', 'cancelled') AND r.finished_at < %(cutoff)s))
"""

# One batch of prunable jobs, oldest first, locked for the batch's transaction. SKIP LOCKED: a row
# someone holds (an operator's requeue or retry of it, another beat replica's batch) is left for
# a later pass, so the prune never waits on anyone and two replicas take disjoint batches; live
# jobs (the only rows a worker locks) never match. The keyset (%(after_at)s, %(after_id)s) moves
# a pass past the rows an app kept, so they cannot fill every batch. Planner note: the range on
# finished_at is job_finished_cover_idx's (finished_at IS NOT NULL); no index of its own is needed.
PRUNE_PICK = (
    "SELECT j.id, j.finished_at FROM workers_job j WHERE "  # noqa: S608 - composed from constants at import
    + _PRUNABLE
    + """AND (j.finished_at, j.id) > (%(after_at)s, %(after_id)s)
ORDER BY j.finished_at, j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED"""
)

# Delete jobs %(ids)s (picked and locked by PRUNE_PICK, minus what the apps kept; the apps' rows
# under them already gone in this transaction) and what hangs on them, in one round trip: their
# operations (all settled or failed: PRUNE_PICK left the open ones' jobs), legacy spans, attempts.
# What Django's on_delete would do for rows that stay: a job retrying one of them forgets its
# retry_of (SET_NULL), an operation of a kept job naming one of their attempts forgets it
# (SET_NULL: a retry's attempt can settle its original's carried operation). The foreign keys are
# DEFERRABLE INITIALLY DEFERRED, so the order of the CTEs does not matter: all hold at commit.
PRUNE_DELETE = """
WITH unlinked AS (
    UPDATE workers_job SET retry_of_id = NULL WHERE retry_of_id = ANY(%(ids)s) AND NOT (id = ANY(%(ids)s)) RETURNING 1
), detached AS (
    UPDATE workers_operation SET attempt_id = NULL
    WHERE attempt_id IN (SELECT id FROM workers_attempt WHERE job_id = ANY(%(ids)s)) AND NOT (job_id = ANY(%(ids)s))
    RETURNING 1
), operations AS (
    DELETE FROM workers_operation WHERE job_id = ANY(%(ids)s) RETURNING 1
), legacy_spans AS (
    DELETE FROM workers_span WHERE job_id = ANY(%(ids)s) RETURNING 1
), attempts AS (
    DELETE FROM workers_attempt WHERE job_id = ANY(%(ids)s) RETURNING 1
), jobs AS (
    DELETE FROM workers_job WHERE id = ANY(%(ids)s) RETURNING 1
)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM attempts), (SELECT count(*) FROM operations)
"""

# koala_prune --dry-run: how many jobs (and their attempts) the engine's rules would prune now,
# before the apps' keeps (a workflow's live run, an unsettled export, an open review).
COUNT_PRUNABLE = (
    "SELECT count(*), COALESCE(sum((SELECT count(*) FROM workers_attempt a WHERE a.job_id = j.id)), 0) "  # noqa: S608 - constants
    "FROM workers_job j WHERE " + _PRUNABLE
)

# koala_prune --dry-run: finished jobs past the window that an open operation keeps.
COUNT_PINNED_BY_OPERATIONS = """
SELECT count(DISTINCT o.job_id) FROM workers_operation o JOIN workers_job j ON j.id = o.job_id
WHERE o.state IN ('in_flight', 'uncertain') AND j.finished_at < %(cutoff)s AND j.state IN ('succeeded', 'failed', 'cancelled')
"""


# -- session bounds (workers.dbsession) ----------------------------------------------------------------

# Bound this session's statements, lock waits and idle transactions (params: the three durations).
SESSION_BOUNDS = (
    "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false), "
    "set_config('idle_in_transaction_session_timeout', %s, false)"
)

# Through a transaction pooler the bounds cannot be set per session (the next transaction may run on
# another server session): they must come from the role's settings; this reads what a session has.
SESSION_BOUNDS_CURRENT = (
    "SELECT current_user, current_database(), "
    "(SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'), "
    "(SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout'), "
    "(SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout')"
)

# Which server session answers (pooler detection, workers.dbsession.check_pooling).
BACKEND_PID = "SELECT pg_backend_pid()"

# -- the console's dashboard (console.selectors.dashboard) -------------------------------------------
#
# Every figure of the page is one bounded index read, whatever the table holds (issue 9, scenario
# 7): the queue list is a loose index scan (one descent per queue), each live count stops at the
# cap it is given (%(cap)s), the oldest due job is the first entry of its queue's range, and the
# percentiles are over the newest %(sample)s attempts. The texts below are byte for byte those the
# page ran when tests/integration/test_query_plans.py and bench/scale.py measured them (their
# indentation included: they were written inside the functions that run them).

# For the rest of the dashboard's transaction (SET LOCAL): no JIT, no parallel workers.
#
# Planner note. Every statement of the page is a bounded index read of a few thousand entries at
# most: at a million jobs the planner's row guesses for the LATERAL/recursive walks still crossed
# jit_above_cost (18 ms of JIT compile for a 25 ms read) and launched parallel workers (35 ms to
# start them on a busy host) for 15 ms of work.
DASHBOARD_SESSION = "SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)"

# Jobs finished in the window [%(day)s, %(now)s] as (queue, hour, finished since %(hour)s,
# succeeded, failed): one index-only read of the window on job_finished_cover_idx (its entries
# carry state and queue) that serves both the per-queue completions and the hourly charts.
DASHBOARD_FINISHED_JOBS = """
            SELECT queue, date_trunc('hour', finished_at) AS hour, finished_at >= %(hour)s AS last_hour,
                   count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'failed')
            FROM workers_job WHERE finished_at >= %(day)s AND finished_at <= %(now)s
            GROUP BY 1, 2, 3
            """

# The queues that hold any job, walked on job_queue_state_list_idx (queue leading) one queue
# at a time, as the dispatcher's DISPATCH_DUE does, instead of a DISTINCT over the table.
_DASHBOARD_QUEUES = """
WITH RECURSIVE queues(queue) AS (
    (SELECT queue FROM workers_job ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM workers_job j WHERE j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
)
"""

# Per queue: capped counts (depth, due at %(now)s, running, parked; each stops at %(cap)s), each
# a range of at most cap entries of job_queue_state_list_idx (depth, running, parked: queue and
# state lead it) or job_queued_due_idx (due: queue, then scheduled_at <= now); the oldest due job
# (id, scheduled_at) is the first entry of that same range.
DASHBOARD_LIVE_COUNTS = (
    _DASHBOARD_QUEUES  # noqa: S608 (a constant CTE in front of a constant query; values are bound)
    + """
SELECT q.queue,
    (SELECT count(*) FROM (SELECT 1 FROM workers_job WHERE state = 'queued' AND queue = q.queue LIMIT %(cap)s) t),
    (SELECT count(*) FROM (SELECT 1 FROM workers_job
        WHERE state = 'queued' AND queue = q.queue AND scheduled_at <= %(now)s LIMIT %(cap)s) t),
    (SELECT count(*) FROM (SELECT 1 FROM workers_job WHERE state = 'running' AND queue = q.queue LIMIT %(cap)s) t),
    (SELECT count(*) FROM (SELECT 1 FROM workers_job WHERE state = 'parked' AND queue = q.queue LIMIT %(cap)s) t),
    o.id, o.scheduled_at
FROM queues q
LEFT JOIN LATERAL (
    SELECT id, scheduled_at FROM workers_job
    WHERE state = 'queued' AND queue = q.queue AND scheduled_at <= %(now)s
    ORDER BY scheduled_at, id LIMIT 1
) o ON true
WHERE q.queue IS NOT NULL
"""
)

# One statement, two samples (one round trip), as (what, queue, p50, p95, sample size):
# - queue wait: from when a job was due (scheduled_at, moved by backoff and requeue) to the
#   start of its latest attempt (the one holding the job's current lease token), over the
#   newest %(sample)s attempts started in the window (attempt_started_idx, backwards);
# - run time: the newest %(sample)s attempts that finished in the window (attempt_finished_idx,
#   backwards), except unservable/parked hand-backs that ran nothing.
DASHBOARD_WAIT_AND_RUN_SAMPLES = """
            (SELECT 'wait', j.queue,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY GREATEST(EXTRACT(EPOCH FROM a.started_at - j.scheduled_at), 0)),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY GREATEST(EXTRACT(EPOCH FROM a.started_at - j.scheduled_at), 0)),
                   count(*)
            FROM (
                SELECT job_id, lease_token, started_at FROM workers_attempt
                WHERE started_at >= %(day)s AND started_at <= %(now)s ORDER BY started_at DESC LIMIT %(sample)s
            ) a JOIN workers_job j ON j.id = a.job_id
            WHERE a.lease_token = j.lease_token AND j.state <> 'queued'
            GROUP BY j.queue)
            UNION ALL
            (SELECT 'run', j.queue,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.finished_at - a.started_at)),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.finished_at - a.started_at)),
                   count(*)
            FROM (
                SELECT job_id, started_at, finished_at FROM workers_attempt
                WHERE finished_at >= %(day)s AND finished_at <= %(now)s AND outcome NOT IN ('unservable', 'parked')
                ORDER BY finished_at DESC LIMIT %(sample)s
            ) a JOIN workers_job j ON j.id = a.job_id
            GROUP BY j.queue)
            """

# The oldest due job's scheduled_at (due at %(now)s) of each queue with queued jobs (the
# worker-health check's "due work"): one probe of job_queued_due_idx per queue.
DASHBOARD_OLDEST_DUE = """
WITH RECURSIVE queues(queue) AS (
    (SELECT queue FROM workers_job WHERE state = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM workers_job j WHERE j.state = 'queued' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
)
SELECT q.queue, o.scheduled_at
FROM queues q
CROSS JOIN LATERAL (
    SELECT scheduled_at FROM workers_job
    WHERE state = 'queued' AND queue = q.queue AND scheduled_at <= %(now)s
    ORDER BY scheduled_at, id LIMIT 1
) o
WHERE q.queue IS NOT NULL
"""

# Each worker's live attempt (a process runs one at a time) as (worker, job id, started), for the
# workers named in %s: one probe of attempt_live_worker_idx per worker, whatever the attempt
# table holds.
DASHBOARD_LIVE_ATTEMPTS = """
            SELECT w.name, a.job_id, a.started_at FROM unnest(%s::text[]) AS w(name)
            CROSS JOIN LATERAL (
                SELECT job_id, started_at FROM workers_attempt
                WHERE worker_id = w.name AND finished_at IS NULL LIMIT 1
            ) a
            """

# The id of the newest attempt each worker in %s finished since %s (a RawSQL subquery of an
# Attempt query): one descent of attempt_worker_finished_idx (worker_id, finished_at DESC) per
# worker, not a DISTINCT ON over the day's attempts.
DASHBOARD_LAST_FINISHED_ATTEMPTS = """
        SELECT a.id FROM unnest(%s::text[]) AS w(name)
        CROSS JOIN LATERAL (
            SELECT id FROM workers_attempt
            WHERE worker_id = w.name AND finished_at >= %s ORDER BY finished_at DESC LIMIT 1
        ) a
        """

# The id of the newest operation each worker in %s settled since %s (a RawSQL subquery of an
# Operation query): per worker (LATERAL, top 1) over its attempts (attempt_worker_finished_idx)
# and their operations (the attempt_id index), not a DISTINCT ON sorting every worker's
# operations of the day together.
DASHBOARD_LAST_SETTLED_OPERATIONS = """
        SELECT o.id FROM unnest(%s::text[]) AS w(name)
        CROSS JOIN LATERAL (
            SELECT op.id FROM workers_attempt a JOIN workers_operation op ON op.attempt_id = a.id
            WHERE a.worker_id = w.name AND op.settled_at >= %s
            ORDER BY op.settled_at DESC LIMIT 1
        ) o
        """

# Retried/orphaned attempts and cost (minor units) per hour in [%(since)s, %(now)s] as
# (what, hour, value): one statement, one round trip.
DASHBOARD_HOURLY_RETRIES_AND_COST = """
            SELECT 'retries', date_trunc('hour', finished_at) AS hour, count(*)::numeric
            FROM workers_attempt WHERE finished_at >= %(since)s AND finished_at <= %(now)s AND outcome IN ('retry', 'orphaned')
            GROUP BY hour
            UNION ALL
            SELECT 'cost', date_trunc('hour', settled_at) AS hour, sum(cost_minor)::numeric
            FROM workers_operation WHERE settled_at >= %(since)s AND settled_at <= %(now)s AND cost_minor IS NOT NULL
            GROUP BY hour
            """

# -- people deciding a review (reviews.services) -----------------------------------------------------

# Lock the job row of review %s, first (FOR UPDATE OF j: the job's row, not the review's). Lock
# order: job, then review, as cancel_job (which withdraws the job's reviews) and the expiry do;
# deciding the review first and touching the job after would deadlock against a concurrent
# cancel. Holding the job also keeps the state the decision's UPDATE tests (parked waiting for
# review) true until the caller commits.
LOCK_JOB_OF_REVIEW = (
    "SELECT j.id FROM workers_job j JOIN reviews_reviewrequest r ON r.job_id = j.id WHERE r.id = %s FOR UPDATE OF j"
)

# -- settling exports the engine ended (exports.services.settle_exports) ---------------------------

# Copy the outcome the engine decided on its own (attempts exhausted, orphaned, a job cancelled
# with koala_cancel) into every export still queued or running whose job has failed or been
# cancelled ({only}: every export, or those in %(ids)s; filled below with constants only).
# exports.selectors._as_settled shows an export as this will store it: keep the two in step
# (tests/integration/test_exports_reads.py compares them).
_SETTLE_EXPORTS = """
UPDATE exports_export e
SET state = j.state,
    failure_code = CASE WHEN j.state = 'failed' THEN COALESCE(j.failure_reason, 'failed') ELSE '' END,
    error_message = LEFT(j.error_message, 500),
    finished_at = COALESCE(j.finished_at, now()),
    updated_at = now()
FROM workers_job j
WHERE e.job_id = j.id AND e.state IN ('queued', 'running') AND j.state IN ('failed', 'cancelled') {only}
"""
SETTLE_EXPORTS = _SETTLE_EXPORTS.format(only="")
SETTLE_EXPORTS_BY_ID = _SETTLE_EXPORTS.format(only="AND e.id = ANY(%(ids)s)")


# -- the worker API (api.protocol) ------------------------------------------------------------------

# The leases worker %s holds now: its running jobs (the acquire's concurrency check, right before
# each claim, so the 429 is exact across server processes).
COUNT_HELD = "SELECT count(*) FROM workers_job WHERE state = 'running' AND lease_holder = %s"

# Is any job due on the queues in %s? One index probe (job_queued_due_idx): the idle poller's cost.
ANY_DUE = "SELECT EXISTS (SELECT 1 FROM workers_job WHERE state = 'queued' AND queue = ANY(%s) AND scheduled_at <= now())"


# -- the attempts' spans (traces.services.record_attempt_spans) -------------------------------------

# Store a span for every finished attempt of the jobs in %(job_ids)s that has none yet: run inside
# the transaction that records their transition (the on-transition hook), so an attempt's span
# commits with its end. One statement for the batch, whatever the path that ended the attempt
# (its own report, the reaper's orphaned mark, a cancel, a requeue): the attempt row is the fact.
# The span id is workers.spans.attempt_span_id computed here, sha256("trace:job:lease_token")'s
# first 16 hex (tests/integration/test_traces.py holds the two equal); the unique (attempt,
# span_id) makes a second store of the same attempt (a repeated hook, an earlier attempt seen
# again with a later transition) a no-op, so no attempt ever has two spans. %(parents)s is a JSON
# object job id → parent span id (workers.hooks.span_parents; '{}' when nobody says).
INSERT_ATTEMPT_SPANS = """
INSERT INTO traces_span
    (job_id, attempt_id, trace_id, span_id, parent_id, kind, name, started_at, ended_at, attributes, usage, error)
SELECT j.id, a.id, j.trace_id,
       left(encode(sha256(convert_to(j.trace_id || ':' || j.id || ':' || a.lease_token, 'UTF8')), 'hex'), 16),
       COALESCE(%(parents)s::jsonb ->> j.id::text, ''), 'attempt', j.kind, a.started_at, a.finished_at,
       jsonb_build_object(
           'koala.job.id', j.id, 'koala.job.kind', j.kind, 'koala.job.version', j.version,
           'koala.queue', j.queue, 'koala.attempt.number', a.number, 'koala.attempt.outcome', a.outcome,
           'koala.worker.id', a.worker_id),
       a.usage,
       CASE WHEN a.outcome IN ('retry', 'failed', 'orphaned') THEN COALESCE(NULLIF(a.error_class, ''), a.outcome) ELSE '' END
FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id
WHERE a.job_id = ANY(%(job_ids)s) AND a.finished_at IS NOT NULL
ON CONFLICT (attempt_id, span_id) DO NOTHING
"""


# -- Prometheus metrics (metrics.services: the fold; metrics.selectors: the scrape) ----------------
#
# A counter is its tally (metrics_*tally, what the fold passed) plus the engine's rows finished at
# or after the fold mark (metrics_foldmark.folded_before): the fold adds [mark, horizon) and moves
# the mark to the horizon in one transaction, so each row is counted once, whenever it is read.
# The tail the scrape adds is what finished since the last fold (a beat interval or two), read by
# range on attempt_finished_idx / job_finished_cover_idx, whatever the tables hold.

# The newest time before which every attempt or job end is committed: the start of the oldest
# transaction still open (an end's finished_at is its transaction's now(), set at or after its
# start, so nothing still uncommitted can land before it), less a margin for the few ends
# stamped by the application's clock (timezone.now()). The fold's own session is left out.
METRICS_FOLD_HORIZON = """
SELECT LEAST(
    statement_timestamp(),
    COALESCE(
        (SELECT min(xact_start) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL),
        'infinity'
    )
) - make_interval(secs => %(margin)s)
"""

# The mark's first row: before every end on record (or now, with nothing finished yet).
METRICS_MARK_CREATE = """
INSERT INTO metrics_foldmark (name, folded_before, folded_at)
VALUES (%(name)s, COALESCE(LEAST((SELECT min(finished_at) FROM workers_attempt WHERE finished_at IS NOT NULL),
                                 (SELECT min(finished_at) FROM workers_job WHERE finished_at IS NOT NULL)), now()), now())
ON CONFLICT (name) DO NOTHING
"""

# Which rows a fold or the retention hook adds: a window of finished_at, or the pruned jobs' rows
# not folded yet. Each tally statement below is composed with both, once, at import.
_METRICS_ATTEMPT_WINDOW = "a.finished_at >= %(from)s AND a.finished_at < %(upto)s"
_METRICS_ATTEMPT_PRUNED = "a.job_id = ANY(%(ids)s) AND a.finished_at >= %(from)s"
_METRICS_JOB_WINDOW = "j.finished_at >= %(from)s AND j.finished_at < %(upto)s"
_METRICS_JOB_PRUNED = "j.id = ANY(%(ids)s) AND j.finished_at >= %(from)s"

_METRICS_ADD_COMPLETIONS = """
INSERT INTO metrics_completiontally (queue, kind, outcome, count)
SELECT j.queue, j.kind, a.outcome, count(*)
FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id
WHERE {where} AND a.outcome IS NOT NULL
GROUP BY 1, 2, 3
ON CONFLICT (queue, kind, outcome) DO UPDATE SET count = metrics_completiontally.count + EXCLUDED.count
"""

# The parts of an attempt's duration, each a row (NULL parts are left out): total by the
# database's clock from start to end; compute, database and storage wait as its worker reported.
# An unservable attempt ran no body and is no duration. bucket = how many bounds lie below the
# value: the index of the first bound at or above it (Prometheus' le), len(bounds) for +Inf.
_METRICS_DURATION_PARTS = """
FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id
CROSS JOIN LATERAL (VALUES
    ('total', extract(epoch FROM a.finished_at - a.started_at)::float8),
    ('compute', a.compute_seconds),
    ('database_wait', a.db_wait_seconds),
    ('storage_wait', a.storage_wait_seconds)
) AS p(part, seconds)
WHERE {where} AND a.outcome IS NOT NULL AND a.outcome <> 'unservable' AND p.seconds IS NOT NULL
"""
# Bounds below the value, by one width_bucket (a binary search; a subquery over the bounds per row
# cost 120 ms for a tail of 5,000 attempts): width_bucket(x, ascending t) counts the t <= x, so
# on the negated bounds, ascending (%(negated)s: -14400 … -0.005) it counts the bounds >= the
# value; the bounds below it are the rest. Exact at a bound: 1.0 s falls in le="1.0".
_METRICS_BUCKET = "(cardinality(%(negated)s::float8[]) - width_bucket(-p.seconds, %(negated)s::float8[]))"
_METRICS_ADD_DURATIONS = (
    "INSERT INTO metrics_durationtally (kind, part, bucket, count, total)\n"
    f"SELECT j.kind, p.part, {_METRICS_BUCKET}, count(*), sum(p.seconds)" + _METRICS_DURATION_PARTS + "GROUP BY 1, 2, 3\n"
    "ON CONFLICT (kind, part, bucket) DO UPDATE SET count = metrics_durationtally.count + EXCLUDED.count,\n"
    "    total = metrics_durationtally.total + EXCLUDED.total"
)

_METRICS_ADD_FAILURES = """
INSERT INTO metrics_failuretally (queue, kind, reason, count)
SELECT j.queue, j.kind, j.failure_reason, count(*)
FROM workers_job j
WHERE {where} AND j.state = 'failed' AND j.failure_reason IS NOT NULL
GROUP BY 1, 2, 3
ON CONFLICT (queue, kind, reason) DO UPDATE SET count = metrics_failuretally.count + EXCLUDED.count
"""

# Finished jobs kept: the fold adds the window's; the retention hook takes off the pruned jobs
# the fold had added (finished before the mark), as negative counts.
_METRICS_KEPT = """
INSERT INTO metrics_keptjobtally (queue, state, count)
SELECT j.queue, j.state, {sign} count(*)
FROM workers_job j
WHERE {where} AND j.state IN ('succeeded', 'failed', 'cancelled')
GROUP BY 1, 2
ON CONFLICT (queue, state) DO UPDATE SET count = metrics_keptjobtally.count + EXCLUDED.count
"""

METRICS_FOLD_COMPLETIONS = _METRICS_ADD_COMPLETIONS.format(where=_METRICS_ATTEMPT_WINDOW)
METRICS_FOLD_DURATIONS = _METRICS_ADD_DURATIONS.format(where=_METRICS_ATTEMPT_WINDOW)
METRICS_FOLD_FAILURES = _METRICS_ADD_FAILURES.format(where=_METRICS_JOB_WINDOW)
METRICS_FOLD_KEPT = _METRICS_KEPT.format(sign="", where=_METRICS_JOB_WINDOW)
METRICS_PRUNED_COMPLETIONS = _METRICS_ADD_COMPLETIONS.format(where=_METRICS_ATTEMPT_PRUNED)
METRICS_PRUNED_DURATIONS = _METRICS_ADD_DURATIONS.format(where=_METRICS_ATTEMPT_PRUNED)
METRICS_PRUNED_FAILURES = _METRICS_ADD_FAILURES.format(where=_METRICS_JOB_PRUNED)
METRICS_PRUNED_KEPT = _METRICS_KEPT.format(sign="-", where="j.id = ANY(%(ids)s) AND j.finished_at < %(from)s")

# The scrape's snapshot: one read-only REPEATABLE READ transaction, so every number is of one
# moment (the first statement of the transaction), with the dashboard's planner settings for its rest.
METRICS_SNAPSHOT_BEGIN = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
METRICS_SNAPSHOT_SESSION = "SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)"

# %(mark)s: the fold mark the scrape read first in its snapshot (metrics.selectors), or -infinity
# before any fold (then the tail is every row: still exact). A bound value, not a subquery: with
# the mark unknown when the statement is planned, PostgreSQL guessed a third of the attempts past
# it and hashed the whole job table (550 ms at 1M jobs, for a tail of 5,000 attempts).
_METRICS_MARK = "%(mark)s::timestamptz"

# The attempts that ended since the mark, in one pass that serves two families (the tallies are
# read through the ORM and added in Python): ('completion', queue, kind, outcome, NULL, count,
# NULL) and ('duration', NULL, kind, part, bucket, count, sum). One join of the tail to its jobs,
# by primary key; attempt_finished_idx gives the tail as a range.
METRICS_ATTEMPT_TAIL = (  # composed at import
    "WITH t AS MATERIALIZED (\n"  # noqa: S608 - composed at import
    "    SELECT j.queue, j.kind, a.outcome, a.started_at, a.finished_at, a.compute_seconds, a.db_wait_seconds,\n"
    "           a.storage_wait_seconds\n"
    "    FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id\n"
    f"    WHERE a.finished_at >= {_METRICS_MARK} AND a.outcome IS NOT NULL\n"
    ")\n"
    "SELECT 'completion', queue, kind, outcome, NULL::int, count(*), NULL::float8 FROM t GROUP BY 2, 3, 4\n"
    "UNION ALL\n"
    f"SELECT 'duration', NULL, a.kind, p.part, {_METRICS_BUCKET}, count(*), sum(p.seconds)\n"
    + _METRICS_DURATION_PARTS.replace("FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id", "FROM t a").format(
        where="TRUE"
    )
    + "GROUP BY 3, 4, 5"
)

# Jobs that ended failed since the mark, by queue, kind and reason: an index-only range of
# job_failed_finished_idx (migration 0019), which carries exactly these columns.
METRICS_FAILURE_TAIL = f"""
SELECT queue, kind, failure_reason, count(*) FROM workers_job
WHERE state = 'failed' AND finished_at >= {_METRICS_MARK} AND failure_reason IS NOT NULL
GROUP BY 1, 2, 3
"""  # noqa: S608 - composed at import

# Jobs by queue and state: the live states counted on their partial indexes (job_queued_due_idx
# for queued: one index-only pass counts each queue, then per queue the not-yet-due entries (a
# range past now: the due count is the rest, cheaper than testing every entry, 15 ms instead of
# 18 at 200,000 queued) and the first due entry (the oldest due job: one descent)), running and
# parked on job_live_idx (0019: state, queue, park_reason; index-only), the orphaned leases on
# job_lease_expiry_idx; the finished ones are the kept tally plus the tail since the mark.
METRICS_QUEUED = """
SELECT g.queue, g.n, g.n - later.n, due.oldest
FROM (SELECT queue, count(*) AS n FROM workers_job WHERE state = 'queued' AND scheduled_at IS NOT NULL GROUP BY queue) g
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM workers_job
    WHERE state = 'queued' AND scheduled_at IS NOT NULL AND queue = g.queue AND scheduled_at > %(now)s
) later
CROSS JOIN LATERAL (
    SELECT min(scheduled_at) AS oldest FROM workers_job
    WHERE state = 'queued' AND scheduled_at IS NOT NULL AND queue = g.queue AND scheduled_at <= %(now)s
) due
"""
METRICS_RUNNING_PARKED = """
SELECT state, queue, park_reason, count(*) FROM workers_job WHERE state IN ('running', 'parked') GROUP BY 1, 2, 3
"""
METRICS_ORPHANED = "SELECT count(*) FROM workers_job WHERE state = 'running' AND lease_expires_at < %(now)s"
METRICS_KEPT_TAIL = f"""
SELECT queue, state, count(*) FROM workers_job
WHERE finished_at >= {_METRICS_MARK} AND state IN ('succeeded', 'failed', 'cancelled')
GROUP BY 1, 2
"""  # noqa: S608 - composed at import

# The newest finished attempt and settled operation: one descent of attempt_finished_idx and of
# operation_settled_idx (migration 0019) each.
METRICS_LAST_ENDS = """
SELECT (SELECT max(finished_at) FROM workers_attempt WHERE finished_at IS NOT NULL),
       (SELECT max(settled_at) FROM workers_operation WHERE settled_at IS NOT NULL)
"""

# Breaker trips: every breaker pause ever written (pauses are never pruned), by kind.
METRICS_BREAKER_TRIPS = """
SELECT target, count(*), count(*) FILTER (WHERE lifted_at IS NULL AND (expires_at IS NULL OR expires_at > now()))
FROM workers_pause WHERE source = 'circuit_breaker' AND scope = 'kind'
GROUP BY target
"""

# -- the hot statements' prepared forms (workers.prepared) ------------------------------------------

# Django binds values on the client, so PostgreSQL parses, analyses and plans each statement anew
# on every call: in the live benchmark that was more than half of the database's time (planning
# the claim 0.64 ms against 0.25 ms to run it). Each statement below is prepared once per
# connection (``PREPARE name AS`` its text with $1..$n for its placeholders) and run as ``EXECUTE
# name(…)`` with the same bound values, so the server reuses its parse tree and, once its generic
# plan costs no more than the custom ones, its plan. Only statements whose outermost output is
# a fixed column list are here: a prepared ``SELECT *`` or ``RETURNING *`` would fail with "cached
# plan must not change result type" after a migration adds a column to the table.


class Prepared:
    """A statement's prepared form: ``prepare`` runs once per session, ``execute`` takes the
    statement's own parameters (the same mapping or sequence the statement would)."""

    __slots__ = ("deallocate", "execute", "name", "prepare")

    def __init__(self, name: str, statement: str) -> None:
        names: list[str] = []
        positional = 0

        def number(match: re.Match[str]) -> str:
            nonlocal positional
            placeholder = match.group(0)
            if placeholder == "%%":
                return "%"
            if placeholder == "%s":
                positional += 1
                return f"${positional}"
            key = match.group(1)
            if key not in names:
                names.append(key)
            return f"${names.index(key) + 1}"

        body = _PLACEHOLDER.sub(number, statement)
        if names and positional:
            raise ValueError(f"{name}: a statement takes named or positional parameters, not both")
        self.name = name
        self.prepare = f"PREPARE {name} AS {body}"
        self.deallocate = f"DEALLOCATE {name}"
        arguments = ", ".join(f"%({key})s" for key in names) if names else ", ".join(["%s"] * positional)
        self.execute = f"EXECUTE {name}({arguments})" if arguments else f"EXECUTE {name}"


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")

# A PREPARE inside the caller's transaction runs under this savepoint: if it fails, only it is undone.
PREPARE_SAVEPOINT = "SAVEPOINT koala_prepare"
PREPARE_RELEASE = "RELEASE SAVEPOINT koala_prepare"
PREPARE_ROLLBACK = "ROLLBACK TO SAVEPOINT koala_prepare"

# Statement text -> its prepared form: what workers.prepared's cursor looks each statement up in.
PREPARED: dict[str, Prepared] = {
    statement: Prepared(name, statement)
    for name, statement in (
        ("koala_claim_job", CLAIM_JOB),
        ("koala_claim_next", CLAIM_NEXT),
        ("koala_claim_next_many", CLAIM_NEXT_MANY),
        ("koala_heartbeat", HEARTBEAT),
        ("koala_heartbeat_many", HEARTBEAT_MANY),
        ("koala_hold_lease", HOLD_LEASE),
        ("koala_complete", COMPLETE),
        ("koala_complete_many", COMPLETE_MANY),
        ("koala_retry_later", RETRY_LATER),
        ("koala_fail", FAIL),
        ("koala_release", RELEASE),
        ("koala_insert_job", insert_jobs(1)),
        ("koala_attempt_spans", INSERT_ATTEMPT_SPANS),
        ("koala_lease_of_attempt", LEASE_OF_ATTEMPT),
        ("koala_count_held", COUNT_HELD),
        ("koala_any_due", ANY_DUE),
    )
}
