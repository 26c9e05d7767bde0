"""Network partitions that keep sockets open, through a TCP proxy between one process and PostgreSQL.

The partitioned process (a worker or a beat) talks to PostgreSQL through ``FaultProxy``; every
other process connects directly. A blackhole stops bytes in both directions while both ends
keep their sockets, like packets lost on a link, and heals without losing anything.

What must hold, asserted on rows and on the outside world's record (``call`` and ``effect``
lines of the world file, with the caller's pid), never on log lines:
- a stale attempt never commits an operation record and never calls the provider;
- a reclaimer never waits on a stale transaction for longer than the session bounds, so the
  job completes *while* the partition lasts;
- terminal states never revert when the stale side's late writes finally arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import wait_for, worker_env
from tests.dburl import database_url
from tests.fakes.netproxy import FaultProxy
from tests.kinds import effect_lines, world_effects
from tests.support.fleet import attempts, job, rq_workers, wait_state, wait_workers_ready
from workers.models import JobState, Operation, Outcome
from workers.services.jobs import enqueue
from workers.services.maintenance import ReapReport, reap

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
# services: the proxy's upstream is PostgreSQL's TCP port or the embedded one's unix socket.
pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True)]

# Test workers run with a 3 s lease (tests/conftest.py), so the session bounds default to
# statement 1 s, lock 0.5 s, idle in transaction 1 s. A partition of PARTITION seconds outlasts
# lease + grace + a whole second attempt several times over.
PARTITION = 20.0


def _upstream() -> tuple[str, int] | str:
    params = connection.settings_dict
    host = params.get("HOST") or "/var/run/postgresql"
    port = int(params.get("PORT") or 5432)
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}"  # the embedded PostgreSQL listens on a unix socket
    return (host, port)


def _proxied_url(proxy: FaultProxy) -> str:
    # Pattern triggers read the client's bytes: no TLS on this hop.
    return database_url(connection.settings_dict, host="127.0.0.1", port=proxy.port, sslmode="disable")


@pytest.fixture
def pg_proxy() -> Iterator[FaultProxy]:
    proxy = FaultProxy(_upstream()).start()
    try:
        yield proxy
    finally:
        proxy.close()


def start_partitioned_worker(processes, proxy: FaultProxy, name: str = "stale"):  # type: ignore[no-untyped-def]
    """A worker whose PostgreSQL traffic goes through ``proxy``, ready to claim."""
    worker = processes.worker("--name", name, env=worker_env(DATABASE_URL=_proxied_url(proxy)), name=name)
    wait_workers_ready([worker])
    return worker


def start_the_takeover(processes) -> None:  # type: ignore[no-untyped-def]
    """A worker and a beat on direct connections: what reclaims and reruns the job."""
    healthy = processes.worker("--name", "healthy", name="healthy")
    processes.beat()
    wait_workers_ready([healthy])


def let_the_stale_side_act(name: str = "stale", timeout: float = 20.0) -> None:
    """After heal(): the stale worker gets its held replies within milliseconds and would act on
    them at once (call the provider, write a row). Nothing in the database marks "it chose to do
    nothing", but RQ counts the delivery as handled once the worker's drain has returned: by then
    everything the stale attempt was going to try has been tried (and the assertions after this
    would catch any act)."""

    def done() -> bool:
        worker = rq_workers().get(name)
        handled = worker.successful_job_count + worker.failed_job_count if worker is not None else 0
        return handled >= 1 and worker is not None and worker.get_state() == "idle"

    wait_for(done, timeout=timeout, what=f"the stale worker {name} to finish its delivery")


def calls(world: str) -> list[list[str]]:
    """Every call that reached the provider: ``call <key> <attempt> <pid>``."""
    return [line for line in effect_lines(world) if line and line[0] == "call"]


def _charge(world: str, **extra: object) -> int:
    return enqueue(kind="tests.charge", input={"world": world, "amount": 100, **extra}).job_id


def _assert_one_effect_by_the_owner(job_id: int, world: str, stale_pid: int) -> None:
    done = job(job_id)
    assert done.state == JobState.SUCCEEDED
    assert len(world_effects(world)) == 1, "exactly one charge at the provider"
    assert [c for c in calls(world) if int(c[3]) == stale_pid] == [], "the stale attempt called the provider"
    op = Operation.objects.get(job_id=job_id)
    winner = [a for a in attempts(job_id) if a.outcome == Outcome.SUCCEEDED]
    assert len(winner) == 1
    # The ledger row was recorded by the attempt that owns the outcome, never by the stale one.
    assert op.lease_token == winner[0].lease_token
    assert op.attempt_id == winner[0].pk


def test_a_stale_ledger_transaction_never_commits_and_never_calls(processes, pg_proxy: FaultProxy, tmp_path: Path) -> None:
    """Partitioned right after its INSERT of the operation reached the server, inside the
    in-flight transaction: the server ends that transaction, the job is reclaimed and charged
    once while the partition lasts, and the late COMMIT changes nothing."""
    world = str(tmp_path / "world.log")
    stale = start_partitioned_worker(processes, pg_proxy)
    fired = pg_proxy.blackhole_after(b"INSERT INTO workers_operation")
    job_id = _charge(world)
    assert fired.wait(20), "the stale worker never reached the ledger"

    start_the_takeover(processes)
    # While the stale worker is still cut off: reclaimed and completed (nobody queued behind it).
    wait_state(job_id, JobState.SUCCEEDED, timeout=PARTITION)
    assert pg_proxy.blackholed
    pg_proxy.heal()
    let_the_stale_side_act()
    wait_for(lambda: all(a.finished_at for a in attempts(job_id)), timeout=15, what="every attempt settled")
    _assert_one_effect_by_the_owner(job_id, world, stale.pid)
    assert attempts(job_id)[0].outcome == Outcome.ORPHANED


def test_a_lease_lost_after_the_in_flight_commit_stops_before_the_call(processes, pg_proxy: FaultProxy, tmp_path: Path) -> None:
    """The in-flight COMMIT lands but its reply is held past the lease: the replacement
    reconciles the open row and charges once; the stale attempt, answered at last, re-checks
    its lease before calling and stops."""
    world = str(tmp_path / "world.log")
    stale = start_partitioned_worker(processes, pg_proxy)
    fired = pg_proxy.blackhole_after(b"COMMIT")
    job_id = _charge(world)
    assert fired.wait(20), "the stale worker never committed"

    start_the_takeover(processes)
    wait_state(job_id, JobState.SUCCEEDED, timeout=PARTITION)
    pg_proxy.heal()
    let_the_stale_side_act()
    wait_for(lambda: all(a.finished_at for a in attempts(job_id)), timeout=15, what="every attempt settled")
    _assert_one_effect_by_the_owner(job_id, world, stale.pid)
    op = Operation.objects.get(job_id=job_id)
    assert op.state == "succeeded"
    assert op.resolution == "absent"  # the stale row was reconciled (never sent) before the re-send


def test_a_partition_mid_body_reclaims_and_the_stale_body_acts_on_nothing(
    processes, pg_proxy: FaultProxy, tmp_path: Path
) -> None:
    world = str(tmp_path / "world.log")
    stale = start_partitioned_worker(processes, pg_proxy)
    job_id = _charge(world, first_attempt_sleep=6)
    wait_for(lambda: any(line[:2] == ["start", str(job_id)] for line in effect_lines(world)), timeout=20)
    pg_proxy.blackhole()  # heartbeats and everything else stop; the body keeps sleeping

    start_the_takeover(processes)
    wait_state(job_id, JobState.SUCCEEDED, timeout=PARTITION)
    pg_proxy.heal()  # the stale body wakes up and reaches the ledger after the job succeeded
    let_the_stale_side_act()
    wait_for(lambda: all(a.finished_at for a in attempts(job_id)), timeout=15, what="every attempt settled")
    _assert_one_effect_by_the_owner(job_id, world, stale.pid)
    assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]


# Client-side bound statements carry their literals, so these match exactly one statement each.
COMPLETION = b"run_state = run_state ||"  # leases.complete()
LEDGER_SETTLE = b"UPDATE workers_operation SET state = 'succeeded'"  # the ledger recording a done call


@pytest.mark.parametrize("held", [COMPLETION, LEDGER_SETTLE], ids=["completion", "ledger-settle"])
def test_a_report_held_in_a_partition_is_refused_when_it_arrives(
    processes, pg_proxy: FaultProxy, tmp_path: Path, held: bytes
) -> None:
    """The charge was made; then the stale worker's next write (the ledger settling the call,
    or the completion) is held on the way: the job is reclaimed, the re-run settles the open
    operation by lookup (or finds it stored) and calls nothing, and the late write is refused."""
    world = str(tmp_path / "world.log")
    start_partitioned_worker(processes, pg_proxy)
    fired = pg_proxy.hold_on(held)
    job_id = _charge(world)
    assert fired.wait(20)

    start_the_takeover(processes)
    wait_state(job_id, JobState.SUCCEEDED, timeout=PARTITION)
    winner = [a for a in attempts(job_id) if a.outcome == Outcome.SUCCEEDED]
    pg_proxy.heal()
    let_the_stale_side_act()
    assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]
    assert [a.pk for a in attempts(job_id) if a.outcome == Outcome.SUCCEEDED] == [winner[0].pk]
    assert len(world_effects(world)) == 1
    assert len(calls(world)) == 1  # the re-run found the stored result or reconciled it by lookup
    op = Operation.objects.get(job_id=job_id)
    assert op.attempt_id == attempts(job_id)[0].pk  # recorded by the first attempt while it held the lease


def test_a_completion_that_landed_before_the_partition_is_never_undone(processes, pg_proxy: FaultProxy, tmp_path: Path) -> None:
    world = str(tmp_path / "world.log")
    start_partitioned_worker(processes, pg_proxy, name="cutoff")
    # The completion's transaction commits (the statement, the apps' in-transaction hooks, COMMIT),
    # then the link goes silent: the completion landed.
    fired = pg_proxy.blackhole_after(COMPLETION, b"COMMIT")
    job_id = _charge(world)
    assert fired.wait(20)
    processes.beat()
    other = processes.worker("--name", "other", name="other")
    wait_workers_ready([other])
    wait_state(job_id, JobState.SUCCEEDED, timeout=10)
    before = job(job_id).updated_at
    # The silent worker's lease (3 s from its last heartbeat) and the grace (0.5 s) run out by
    # PostgreSQL's clock, with a beat ticking every 0.2 s and an idle worker; then one more reap
    # with no grace at all: a reaper that took the job back would have done so by now.
    wait_for(lambda: _silent_for(job_id, seconds=3.5), timeout=15, what="the silent worker's lease and grace to run out")
    assert reap(grace_seconds=0) == ReapReport(orphaned=0, requeued=0, failed=0, deadline_failed=0)
    pg_proxy.heal()
    let_the_stale_side_act("cutoff")
    done = job(job_id)
    assert done.state == JobState.SUCCEEDED and done.updated_at == before
    assert [a.outcome for a in attempts(job_id)] == [Outcome.SUCCEEDED]
    assert len(world_effects(world)) == 1 and len(calls(world)) == 1


def test_a_partitioned_reaper_never_stalls_the_takeover(processes, pg_proxy: FaultProxy, tmp_path: Path) -> None:
    """A beat partitioned inside its reaping transaction (rows locked, sockets open) must not
    hold up another beat replica: the job is reclaimed and run while the partition lasts."""
    world = str(tmp_path / "world.log")
    doomed = processes.worker("--name", "doomed", name="doomed")
    wait_workers_ready([doomed])
    job_id = _charge(world, first_attempt_sleep=30)
    wait_for(lambda: any(line[:2] == ["start", str(job_id)] for line in effect_lines(world)), timeout=20)
    doomed.kill()  # kill -9 mid-body: the lease will expire with nobody to report
    doomed.wait()
    wait_for(lambda: job(job_id).lease_expires_at is not None and _expired(job_id), timeout=10, what="lease expiry")

    fired = pg_proxy.blackhole_after(b"lease expired at")  # the reaper's first statement
    processes.beat(env=worker_env(DATABASE_URL=_proxied_url(pg_proxy)))
    assert fired.wait(30), "the partitioned beat never started reaping"
    processes.beat()  # the healthy replica
    healthy = processes.worker("--name", "healthy", name="healthy")
    wait_workers_ready([healthy])
    wait_state(job_id, JobState.SUCCEEDED, timeout=PARTITION)
    assert pg_proxy.blackholed
    pg_proxy.heal()
    wait_for(lambda: all(a.finished_at for a in attempts(job_id)), timeout=10)
    assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]
    assert len(world_effects(world)) == 1


def _silent_for(job_id: int, *, seconds: float) -> bool:
    """The job's last attempt has not heartbeaten for ``seconds`` (PostgreSQL's clock)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT now() > max(heartbeat_at) + make_interval(secs => %s) FROM workers_attempt WHERE job_id = %s",
            [seconds, job_id],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _expired(job_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_expires_at < now() FROM workers_job WHERE id = %s", [job_id])
        row = cursor.fetchone()
    return bool(row and row[0])
