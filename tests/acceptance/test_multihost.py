"""Workers on many hosts: hosts are network namespaces (tests/support/netns.py), faults are packets
that stop (nft drop, tc netem) in one host's namespace.

Topology: ``db`` runs its own PostgreSQL and redis-server; ``w1`` and ``w2`` run workers; ``web``
runs the beat and the sandbox payment provider (the outside world). Every host reaches the others
only through its own interface. Faults are made in one host's namespace: nft drops for a partition,
delay and loss with tc netem (or, on a kernel without netem, an nft loss rule and a delaying relay
inside the host: tests/support/netns.py, Host.impair). The test reads rows in the db host's
PostgreSQL with Koala's models (over its unix socket) and counts effects in the provider's own
record (its state file). What each scenario showed: docs/scaling.md, "Workers on many hosts".

Invariants asserted in every scenario: no job lost (every job ends succeeded), one effect per
operation key at the provider, stale attempts rejected (an orphaned attempt stays orphaned, the
ledger row belongs to the winner), tests.support.fleet.assert_engine_invariants on every job.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from devtools.sandbox.provider import ProviderControl
from tests.conftest import REPO, wait_for
from tests.support.effects import PROVIDER_API_KEY
from tests.support.fleet import assert_engine_invariants, attempts, rq_workers, wait_all_terminal, wait_state, wait_workers_ready
from tests.support.netns import PG_PORT, PROVIDER_PORT, REDIS_PORT, Cluster, require_netns
from workers import doorbell
from workers.models import Attempt, Job, JobState, Operation, Outcome, WorkerProcess
from workers.services import budgets
from workers.services.jobs import JobSpec, enqueue, enqueue_many

pytestmark = [pytest.mark.slow, pytest.mark.netns]

EFFECT_KINDS = "workers.builtin_kinds,effects.kinds,tests.kinds"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    require_netns()
    built = Cluster().start()
    try:
        built.migrate("web")
        yield built
    finally:
        built.close()


@pytest.fixture
def hosts(cluster: Cluster, django_db_blocker) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    """The cluster, with this process's ORM on the db host; every host process stopped afterwards."""
    with django_db_blocker.unblock(), cluster.orm():
        doorbell.redis_connection().flushdb()
        try:
            yield cluster
        finally:
            cluster.stop_processes()


@pytest.fixture
def provider(hosts: Cluster) -> ProviderControl:
    """The sandbox provider on the web host; its state file is the outside world's record."""
    web = hosts["web"]
    state = hosts.dir / f"provider-{time.monotonic_ns()}.jsonl"
    proc = web.popen(
        sys.executable, "-m", "devtools.sandbox.provider", "--host", web.address, "--port", str(PROVIDER_PORT),
        "--state", str(state), "--api-key", PROVIDER_API_KEY, name="provider",
    )  # fmt: skip
    control = ProviderControl(f"http://{web.address}:{PROVIDER_PORT}", state)
    wait_for(lambda: b"listening" in _log(hosts, "web-provider") or proc.poll() is not None, timeout=20, what="the provider")
    assert proc.poll() is None, _log(hosts, "web-provider")
    return control


def _log(cluster: Cluster, stem: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(cluster.dir.glob(f"{stem}-*.log")))


def fault(cluster: Cluster, provider: ProviderControl, name: str, **params: object) -> None:
    """Script a provider fault: its control port is reachable only from inside the network."""
    code = f"from devtools.sandbox.provider import ProviderControl as P; P({provider.url!r}, '').fault({name!r}, **{params!r})"
    cluster["web"].run(sys.executable, "-c", code)


def provider_stats(cluster: Cluster, provider: ProviderControl) -> dict:
    code = f"from devtools.sandbox.provider import ProviderControl as P; print(json.dumps(P({provider.url!r}, '').stats()))"
    return json.loads(cluster["web"].run(sys.executable, "-c", "import json; " + code))


def charge_env(cluster: Cluster, provider: ProviderControl, **extra: str) -> dict[str, str]:
    return cluster.env(
        KOALA_JOB_KIND_MODULES=EFFECT_KINDS,
        KOALA_PAYMENTS_URL=provider.url,
        KOALA_PAYMENTS_API_KEY=PROVIDER_API_KEY,
        KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS="0",  # the sandbox's lookups are consistent at once
        KOALA_PAYMENTS_TIMEOUT_SECONDS="30",
        **extra,
    )


def worker_names(job_ids: list[int]) -> Counter[str]:
    names = dict(WorkerProcess.objects.values_list("pk", "name"))
    return Counter(names.get(a.worker_id, "?") for a in Attempt.objects.filter(job_id__in=job_ids, outcome=Outcome.SUCCEEDED))


def assert_one_effect_per_key(provider: ProviderControl, references: list[str]) -> None:
    orders = provider.effects("orders")
    charges = provider.effects("charges")
    assert sorted(o["reference"] for o in orders) == sorted(references), "one order per reference at the provider"
    assert sorted(c["order"] for c in charges) == sorted(o["id"] for o in orders), "one charge per order at the provider"
    for resource in ("orders", "charges"):
        keys = Counter(e.get("key") for e in provider.events("effect", resource))
        assert all(n == 1 for n in keys.values()), f"{resource}: an operation key with two effects: {keys}"


def _order(reference: str, amount: int = 1200) -> dict[str, object]:
    return {"reference": reference, "amount_minor": amount, "currency": "EUR"}


# 1. A worker host cut off from PostgreSQL mid-lease; another host completes the job; heal.
def test_a_host_cut_from_postgresql_mid_lease_is_rejected_when_it_heals(hosts: Cluster, provider: ProviderControl) -> None:
    env = charge_env(hosts, provider)
    stale = hosts["w1"].worker("--name", "stale", env=env)
    wait_workers_ready([stale])
    # The first charge request is held at the provider: the body is in progress, mid-lease.
    fault(hosts, provider, "slow", resource="charges", seconds=8, times=1)
    job_id = enqueue(kind="shop.order_and_charge", input=_order("mh-partition")).job_id
    wait_for(
        lambda: Operation.objects.filter(job_id=job_id, name="charge", state="in_flight").exists(),
        timeout=20,
        what="the stale worker to send the charge",
    )
    hosts["w1"].partition_from(hosts.db.address, PG_PORT)  # heartbeats stop; the body keeps waiting
    hosts["web"].manage("koala_beat", env=env, name="beat")
    hosts["w2"].worker("--name", "healthy", env=env)

    done = wait_state(job_id, JobState.SUCCEEDED, timeout=45)  # while w1 is still cut off
    winner = [a for a in attempts(job_id) if a.outcome == Outcome.SUCCEEDED]
    hosts["w1"].heal()

    def stale_side_done() -> bool:
        worker = rq_workers().get("stale")
        return worker is not None and worker.successful_job_count + worker.failed_job_count >= 1 and worker.get_state() == "idle"

    # After the heal the stale worker's held writes arrive (TCP retransmits): it reports, is refused, listens again.
    wait_for(stale_side_done, timeout=60, what="the stale worker to finish its delivery after the heal")
    wait_for(lambda: all(a.finished_at for a in attempts(job_id)), timeout=15, what="every attempt settled")

    tries = attempts(job_id)
    assert tries[0].outcome == Outcome.ORPHANED, [a.outcome for a in tries]  # its late report changed nothing
    assert [a.pk for a in tries if a.outcome == Outcome.SUCCEEDED] == [winner[0].pk]
    assert WorkerProcess.objects.get(pk=tries[0].worker_id).name == "stale"
    assert WorkerProcess.objects.get(pk=winner[0].worker_id).name == "healthy"
    print("attempts:", [(a.number, a.outcome, a.error_class, WorkerProcess.objects.get(pk=a.worker_id).name) for a in tries])
    # The order was settled before the partition; the charge the stale attempt had in flight
    # was settled by a takeover attempt (reconciled by key, or replayed), never by the stale one.
    order = Operation.objects.get(job_id=job_id, name="order")
    charge = Operation.objects.get(job_id=job_id, name="charge")
    assert (order.state, order.attempt_id) == ("succeeded", tries[0].pk)
    assert charge.state in ("succeeded", "reconciled") and charge.attempt_id != tries[0].pk, (charge.state, charge.attempt_id)
    assert_one_effect_per_key(provider, ["mh-partition"])
    assert Job.objects.get(pk=job_id).result == done.result
    assert stale.poll() is None, "the partitioned worker survived the partition"
    assert_engine_invariants()


# 2. A worker host cut off from Redis only.
def test_a_host_cut_from_redis_only_loses_nothing_and_rejoins(hosts: Cluster) -> None:
    env = hosts.env()
    cut = hosts["w1"].worker("--name", "cut", env=env)
    peer = hosts["w2"].worker("--name", "peer", env=env)
    wait_workers_ready([cut, peer])
    hosts["web"].manage("koala_beat", env=env, name="beat")
    hosts["w1"].partition_from(hosts.db.address, REDIS_PORT)
    seen_before = WorkerProcess.objects.get(pid=cut.pid, name="cut").last_seen_at

    ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop", input={}) for _ in range(40)])]
    wait_all_terminal(ids, timeout=60)
    # The cut worker hears no doorbell (its blocking pop is on a silent socket), so it claims
    # nothing; the peer does all of it. It still heartbeats on PostgreSQL: it stays registered.
    assert worker_names(ids) == Counter({"peer": 40})
    wait_for(
        lambda: WorkerProcess.objects.get(pid=cut.pid, name="cut").last_seen_at > seen_before,
        timeout=10,
        what="the cut worker's heartbeat",
    )
    assert cut.poll() is None

    hosts["w1"].heal()
    peer.terminate()
    peer.wait(timeout=15)
    later = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop", input={}) for _ in range(5)])]
    began = time.monotonic()
    wait_all_terminal(later, timeout=90)
    print(f"the cut worker ran new jobs {time.monotonic() - began:.1f}s after the heal")
    assert worker_names(later) == Counter({"cut": 5})
    assert set(Job.objects.filter(pk__in=ids + later).values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert_engine_invariants()


# 3. 200 ms delay and 10% loss on one worker host during a 2,000-job run.
def test_2000_jobs_with_loss_and_delay_on_one_host_each_succeed_once(hosts: Cluster) -> None:
    # A 10 s lease: with 10% loss a heartbeat can wait for several TCP retransmissions.
    env = hosts.env(KOALA_LEASE_SECONDS="10", KOALA_HEARTBEAT_SECONDS="1")
    slow_env = env | hosts["w1"].impair(delay_ms=200, loss_percent=10)
    slow = [hosts["w1"].worker("--name", f"w1-{n}", env=slow_env) for n in range(2)]
    wait_workers_ready(slow, timeout=60)
    hosts["web"].manage("koala_beat", env=env, name="beat")

    began = time.monotonic()
    ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(2000)])]
    # The healthy host joins once the impaired one is well into the run: left to race from the
    # start, two healthy processes drain 2,000 no-ops before the first 200 ms round trip ends.
    wait_for(
        lambda: Attempt.objects.filter(job_id__in=ids, outcome=Outcome.SUCCEEDED).count() >= 30,
        timeout=60,
        interval=0.2,
        what="the impaired host to finish 30 jobs",
    )
    for n in range(2):
        hosts["w2"].worker("--name", f"w2-{n}", env=env)
    wait_all_terminal(ids, timeout=180)
    print(f"2000 jobs in {time.monotonic() - began:.1f}s ({hosts['w1'].impairment}); by worker: {worker_names(ids)}")

    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == 2000
    per_job = Counter(Attempt.objects.filter(job_id__in=ids, outcome=Outcome.SUCCEEDED).values_list("job_id", flat=True))
    assert len(per_job) == 2000 and set(per_job.values()) == {1}, "every job succeeded exactly once"
    assert not Attempt.objects.filter(job_id__in=ids, finished_at__isnull=True).exists(), "nothing stranded"
    by_host = Counter(name.split("-")[0] for name in worker_names(ids).elements())
    assert by_host["w1"] >= 30 and by_host["w2"] > 0, f"both hosts took part: {by_host}"
    assert_engine_invariants()


# 4. Every process on one worker host killed -9 during a run.
def test_a_host_killed_mid_run_the_other_finishes_with_one_effect_each(hosts: Cluster, provider: ProviderControl) -> None:
    # A concurrency budget across both hosts: it must hold through the crash too.
    budgets.create_budget(
        name="two-hosts-three-charges", scope="kind", target="shop.order_and_charge", concurrency_limit=3, actor="t"
    )
    fault(hosts, provider, "slow", resource="charges", seconds=0.3)
    env = charge_env(hosts, provider)
    workers = [hosts[h].worker("--name", f"{h}-kill-{n}", env=env) for h in ("w1", "w2") for n in range(2)]
    wait_workers_ready(workers, timeout=40)
    hosts["web"].manage("koala_beat", env=env, name="beat")

    references = [f"mh-kill-{n}" for n in range(40)]
    ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="shop.order_and_charge", input=_order(r)) for r in references])]
    w1_ids = set(WorkerProcess.objects.filter(name__startswith="w1-kill-").values_list("pk", flat=True))
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() >= 8
            and Attempt.objects.filter(worker_id__in=w1_ids, finished_at__isnull=True).exists()
        ),
        timeout=60,
        interval=0.05,
        what="a run in progress with a w1 attempt running",
    )
    killed = hosts["w1"].kill_all()
    assert killed and not hosts["w1"].pids()

    wait_all_terminal(ids, timeout=120)
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {JobState.SUCCEEDED}
    orphaned = Attempt.objects.filter(job_id__in=ids, outcome=Outcome.ORPHANED)
    assert orphaned.exists() and {a.worker_id for a in orphaned} <= w1_ids
    assert_one_effect_per_key(provider, references)
    assert provider_stats(hosts, provider)["max_in_flight"]["charges"] <= 3, "the concurrency budget held across hosts"
    assert_engine_invariants()


def test_the_multihost_benchmark_runs_with_tiny_sizes() -> None:
    """bench/multihost.py end to end (its own cluster), as `make bench-multihost` starts it: kept runnable, not timed."""
    require_netns()
    before = namespaces()
    done = subprocess.run(
        [sys.executable, "-m", "bench.multihost", "--jobs", "20", "--workers", "2"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 2 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["db host", "two hosts"], output[-4000:]
    assert namespaces() <= before, "the benchmark deleted the hosts it made"


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}
