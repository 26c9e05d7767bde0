"""Hosts made of Linux network namespaces, for tests (and bench/multihost.py) of workers on many hosts.

A ``Cluster`` is a private network built by the test itself, never touching the machine's own:

- a "switch" namespace holding a bridge; every host is a namespace joined to it by a veth pair
  created inside the switch (its host end is moved straight into the host namespace);
- addresses in SUBNET exist only inside those namespaces; each has its loopback up;
- the database host runs its OWN PostgreSQL (a fresh cluster: Debian's initdb, run as the
  ``postgres`` user, trust for the subnet) and its own redis-server, both started with
  ``ip netns exec``; workers, beat, web and the sandbox provider run on the other hosts the same way;
- a partition is a rule in one host's namespace: ``nft`` drops to one port of one address, or a
  ``tc netem`` qdisc on its interface (delay, loss). Nothing is mocked: the packets stop.

The test process itself lives in the root namespace and reaches the database host's PostgreSQL
and Redis through their unix sockets (sockets in the cluster's directory are not namespaced):
``Cluster.orm()`` points this process's default connection and REDIS_URL at them, so a test
reads rows with Koala's own models, and enqueues with its services.

Names are unique per cluster (pid + counter), so parallel runs never collide; teardown kills every
process in every namespace and deletes the namespaces (which deletes their links) even after a
failure. ``require_netns()`` skips where namespaces cannot be made (not root, no ``ip``), and
fails instead under CI, as ``require_tool`` does.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.system_tools import HOW_TO_INSTALL, in_ci

REPO = Path(__file__).resolve().parent.parent.parent
SUBNET = "10.77.0"  # a /24 that exists only inside the cluster's namespaces
PG_PORT = 5432
REDIS_PORT = 6379
PROVIDER_PORT = 8765
DB_NAME = "koala"
_counter = itertools.count()


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc", "nft", "redis-server", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} not found: {HOW_TO_INSTALL}"
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        return "Debian's PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb) not found"
    probe = f"knprobe{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _run("ip", "netns", "delete", probe, check=False)
    return None


def require_netns() -> None:
    """Skip (fail under CI, where root is available) when namespaces cannot be made."""
    reason = netns_unavailable()
    if reason is None:
        return
    if in_ci():
        pytest.fail(reason)
    pytest.skip(reason)


def pg_bin(name: str) -> str:
    return sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1]


class Host:
    """One namespace on the switch, with one address."""

    def __init__(self, cluster: Cluster, role: str, number: int) -> None:
        self.cluster = cluster
        self.role = role
        self.ns = f"{cluster.prefix}{role}"
        self.address = f"{SUBNET}.{number}"
        self.port_name = f"p-{role}"  # the switch's end of this host's cable
        self.procs: list[subprocess.Popen[bytes]] = []
        self.impairment = ""  # how impair() did it: "netem" or "nft+relay"

    def attach(self) -> None:
        sw = self.cluster.switch
        _run("ip", "netns", "add", self.ns)
        _run("ip", "-n", sw, "link", "add", self.port_name, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        _run("ip", "-n", sw, "link", "set", self.port_name, "master", "br0", "up")
        _run("ip", "-n", self.ns, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _run("ip", "-n", self.ns, "link", "set", "eth0", "up")
        _run("ip", "-n", self.ns, "link", "set", "lo", "up")

    def popen(self, *argv: str, env: dict[str, str] | None = None, name: str = "proc") -> subprocess.Popen[bytes]:
        """``argv`` started inside this host (``ip netns exec`` execs it: the pid is the program's)."""
        log = open(self.cluster.dir / f"{self.role}-{name}-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv],
            cwd=REPO,
            env=env if env is not None else dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise AssertionError(f"{self.role}: {' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def manage(self, *args: str, env: dict[str, str] | None = None, name: str = "manage") -> subprocess.Popen[bytes]:
        return self.popen(sys.executable, str(REPO / "manage.py"), *args, env=env or self.cluster.env(), name=name)

    def worker(self, *extra: str, env: dict[str, str] | None = None, name: str = "worker") -> subprocess.Popen[bytes]:
        return self.manage("koala_worker", "--queues", "default", *extra, env=env, name=name)

    def pids(self) -> list[int]:
        """Every process in this namespace, whoever started it (work horses, pool members)."""
        out = _run("ip", "netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, sig: int = signal.SIGKILL) -> list[int]:
        killed = self.pids()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, sig)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        return killed

    # -- faults: rules in this namespace only ---------------------------------------------------
    def partition_from(self, address: str, port: int) -> None:
        """Drop every TCP packet between this host and ``address:port`` (both ways; sockets stay open)."""
        rules = (
            "table inet partition {\n"
            " chain out { type filter hook output priority 0; policy accept;"
            f" ip daddr {address} tcp dport {port} drop; }}\n"
            " chain in { type filter hook input priority 0; policy accept;"
            f" ip saddr {address} tcp sport {port} drop; }}\n"
            "}\n"
        )
        self.nft(rules)

    def heal(self) -> None:
        _run("ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", "partition", check=False)

    def nft(self, rules: str) -> None:
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise RuntimeError(f"nft in {self.ns} failed: {done.stderr}")

    def impair(self, *, delay_ms: int, loss_percent: int) -> dict[str, str]:
        """Delay and loss on this host's outgoing packets; returns the environment overrides its
        processes need (none where the kernel has netem).

        The way: ``tc qdisc replace dev eth0 root netem delay Xms loss Y%``. Kernels built without
        sch_netem (this project's CI VMs: "Specified qdisc kind is unknown") get the same two
        faults another way: the loss is an nft rule in this namespace (``numgen random mod 100 <
        Y drop`` on every outgoing packet, so TCP really retransmits), and the delay a relay
        process inside this namespace, in front of the database host's PostgreSQL and Redis,
        that holds every chunk X/2 ms each way (tests/fakes/netproxy.py's delay)."""
        netem = _run(
            "ip", "netns", "exec", self.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
            "delay", f"{delay_ms}ms", "loss", f"{loss_percent}%", check=False,
        )  # fmt: skip
        if netem.returncode == 0:
            self.impairment = "netem"
            return {}
        self.impairment = "nft+relay"
        self.nft(
            "table inet impair {\n"
            " chain out { type filter hook output priority 0; policy accept;"
            f' oifname "eth0" numgen random mod 100 < {loss_percent} drop; }}\n'
            "}\n"
        )
        db = self.cluster.db.address
        relay = self.popen(
            sys.executable, "-m", "tests.support.netns", "relay", str(delay_ms / 2000), db, str(PG_PORT), str(REDIS_PORT),
            name="relay",
        )  # fmt: skip
        log = self.cluster.dir / f"{self.role}-relay-{len(self.procs) - 1}.log"
        Cluster._wait(lambda: log.exists() and b"relay" in log.read_bytes(), "the delay relay", relay)
        ports = dict(part.split("=") for part in log.read_text().split()[1:])
        return {
            "DATABASE_URL": f"postgres://root@127.0.0.1:{ports['pg']}/{DB_NAME}",
            "REDIS_URL": f"redis://127.0.0.1:{ports['redis']}/0",
        }

    def clear_impairment(self) -> None:
        _run("ip", "netns", "exec", self.ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        _run("ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", "impair", check=False)


class Cluster:
    """The switch, the hosts, the database host's PostgreSQL and Redis; ``close()`` removes all of it."""

    ROLES = ("db", "w1", "w2", "web")

    def __init__(self, roles: tuple[str, ...] = ROLES) -> None:
        self.prefix = f"k{os.getpid() % 100000}{next(_counter)}"
        self.switch = f"{self.prefix}sw"
        self.dir = Path(tempfile.mkdtemp(prefix="koala-netns-"))
        os.chmod(self.dir, 0o755)
        self.hosts = {role: Host(self, role, n) for n, role in enumerate(roles, start=2)}
        self.pgdata = self.dir / "pgdata"
        self.postgres: subprocess.Popen[bytes] | None = None
        self.redis: subprocess.Popen[bytes] | None = None

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    @property
    def db(self) -> Host:
        return self.hosts["db"]

    # -- building -------------------------------------------------------------------------------
    def start(self) -> Cluster:
        try:
            _run("ip", "netns", "add", self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            _run("ip", "-n", self.switch, "link", "set", "lo", "up")
            for host in self.hosts.values():
                host.attach()
            self._start_postgres()
            self._start_redis()
        except BaseException:
            self.close()
            raise
        return self

    def _start_postgres(self) -> None:
        self.pgdata.mkdir()
        shutil.chown(self.pgdata, "postgres", "postgres")
        as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        _run(*as_postgres, pg_bin("initdb"), "-D", str(self.pgdata), "-U", "root", "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(self.pgdata / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        self.postgres = self.db.popen(
            *as_postgres,
            pg_bin("postgres"),
            "-D",
            str(self.pgdata),
            "-c",
            f"listen_addresses={self.db.address}",
            "-c",
            f"port={PG_PORT}",
            "-c",
            f"unix_socket_directories={self.pgdata}",
            "-c",
            "max_connections=200",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            name="postgres",
        )
        self._wait(lambda: (self.pgdata / f".s.PGSQL.{PG_PORT}").exists(), "PostgreSQL to listen", self.postgres)
        import psycopg

        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(host=str(self.pgdata), port=PG_PORT, user="root", dbname="postgres", autocommit=True) as c:
                    c.execute(f"CREATE DATABASE {DB_NAME}")
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _start_redis(self) -> None:
        self.redis = self.db.popen(
            "redis-server",
            "--bind",
            self.db.address,
            "--port",
            str(REDIS_PORT),
            "--unixsocket",
            str(self.redis_socket),
            "--unixsocketperm",
            "777",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            str(self.dir),
            name="redis",
        )
        self._wait(lambda: self.redis_socket.exists(), "Redis to listen", self.redis)

    @staticmethod
    def _wait(predicate, what: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    # -- addresses --------------------------------------------------------------------------------
    @property
    def redis_socket(self) -> Path:
        return self.dir / "redis.sock"

    def database_url(self) -> str:
        """How the hosts reach PostgreSQL: over the network, through their own interface."""
        return f"postgres://root@{self.db.address}:{PG_PORT}/{DB_NAME}"

    def redis_url(self) -> str:
        return f"redis://{self.db.address}:{REDIS_PORT}/0"

    def local_database_url(self) -> str:
        """How the root namespace (the test, the benchmark) reaches it: the unix socket."""
        return f"postgres://root@/{DB_NAME}?host={self.pgdata}&port={PG_PORT}"

    def local_redis_url(self) -> str:
        return f"unix://{self.redis_socket}?db=0"

    def env(self, **extra: str) -> dict[str, str]:
        """A host process's environment: tests.conftest.worker_env's timings, this cluster's URLs."""
        from tests.conftest import worker_env

        return worker_env(**({"DATABASE_URL": self.database_url(), "REDIS_URL": self.redis_url()} | extra))

    def migrate(self, role: str = "web") -> None:
        proc = self[role].manage("migrate", "--no-input", name="migrate")
        assert proc.wait(timeout=300) == 0, (self.dir / f"{role}-migrate-{len(self[role].procs) - 1}.log").read_text()

    @contextlib.contextmanager
    def orm(self) -> Iterator[None]:
        """This process's default database connection and REDIS_URL on the database host (unix
        sockets), for reading rows with Koala's models; restored afterwards."""
        from django.conf import settings
        from django.db import connections

        from workers import doorbell

        wrapper = connections["default"]
        saved = dict(wrapper.settings_dict)
        saved_redis = settings.REDIS_URL
        wrapper.close()
        wrapper.settings_dict.update({"HOST": str(self.pgdata), "PORT": str(PG_PORT), "NAME": DB_NAME, "USER": "root"})
        wrapper.settings_dict["PASSWORD"] = ""
        settings.REDIS_URL = self.local_redis_url()
        doorbell.reset_connection()
        try:
            yield
        finally:
            wrapper.close()
            wrapper.settings_dict.clear()
            wrapper.settings_dict.update(saved)
            settings.REDIS_URL = saved_redis
            doorbell.reset_connection()

    def db_pids(self) -> list[int]:
        """The PostgreSQL server's processes (postmaster and backends), for CPU samples."""
        return [pid for pid in self.db.pids() if _comm(pid) == "postgres"]

    # -- teardown -----------------------------------------------------------------------------------
    def stop_processes(self, *roles: str) -> None:
        """Every process on these hosts (all but the database host's if none named): SIGTERM, then -9."""
        hosts = [self.hosts[r] for r in roles] if roles else [h for h in self.hosts.values() if h.role != "db"]
        for host in hosts:
            host.kill_all(signal.SIGTERM)
        deadline = time.monotonic() + 8
        while any(h.pids() for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        for host in hosts:
            host.kill_all(signal.SIGKILL)
            host.heal()
            host.clear_impairment()
            host.procs = [p for p in host.procs if p.poll() is None]

    def close(self) -> None:
        for host in self.hosts.values():
            if _exists(host.ns):
                host.kill_all(signal.SIGKILL)
        for host in self.hosts.values():
            for proc in host.procs:
                with contextlib.suppress(Exception):
                    proc.kill()
                    proc.wait(timeout=5)
            _run("ip", "netns", "delete", host.ns, check=False)
        _run("ip", "netns", "delete", self.switch, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def _exists(ns: str) -> bool:
    return os.path.exists(f"/run/netns/{ns}")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _relay(delay_seconds: str, address: str, *ports: str) -> None:
    """``python -m tests.support.netns relay SECONDS ADDRESS PG_PORT REDIS_PORT``: Host.impair's
    delay where the kernel has no netem. Prints ``relay pg=P redis=Q`` (its local ports)."""
    from tests.fakes.netproxy import FaultProxy

    proxies = []
    for port in ports:
        proxy = FaultProxy((address, int(port))).start()
        proxy.delay(float(delay_seconds))
        proxies.append(proxy)
    print("relay", " ".join(f"{name}={p.port}" for name, p in zip(("pg", "redis"), proxies, strict=False)), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    if sys.argv[1:2] == ["relay"]:
        _relay(*sys.argv[2:])
