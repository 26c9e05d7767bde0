"""The shipped systemd units start, and what they start serves.

Each unit's ``ExecStart=`` runs as written, with the environment systemd would give it: the env
example's settings (deploy/systemd/koala.env.example; only DATABASE_URL and REDIS_URL point at
this test's fresh database and private Redis), the secret from a credentials folder (``%d``),
in a temporary tree laid out like the host (``/opt/koala`` → this checkout, ``/var/lib/koala``
the state directory; tests/support/units.py). It runs as the current user, not through systemd
(no init here); what only systemd does, ``systemd-analyze verify`` and ``security`` check
(tests/unit/test_deploy_hardening.py). Of the units' sandbox, the settings that could break
Python are applied for real, by the kernel: each process runs under its unit's system call filter
(``SystemCallFilter=``, with libseccomp, refused calls failing with EPERM) and refusing
writable+executable memory (``MemoryDenyWriteExecute=yes``; PR_SET_MDWE, Linux 6.3 or later).

- the migrate step builds the schema of an empty database and collects the static files;
- the web answers ``/admin/login/`` over the proxy's HTTPS (and redirects plain HTTP there), serves
  the static files and the worker API;
- the worker takes a job, and runs an export that publishes under ``/var/lib/koala``;
- the beat rings a job that fell due (only the dispatcher rings a delayed job);
- each timer's oneshot service runs its ``koala_tick`` task to the end (exit 0), and releases its lease;
- at rest each unit uses under half its MemoryMax and its TasksMax;
- each process stops cleanly on SIGTERM within its unit's TimeoutStopSec;
- the worker's other shapes (``--worker-class fork``, ``--pool 2``) run a job in the same sandbox;
- the env example's settings pass ``manage.py check --deploy`` with no warning.
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from devtools.servers import wait_listening
from tests.conftest import wait_for
from tests.dburl import database_url, libpq_params_of
from tests.support.fleet import free_port
from tests.support.system_tools import require_tool
from tests.support.units import (
    HOST_CODE,
    TICK_SERVICES,
    TIMER_UNITS,
    Host,
    Unit,
    allowed_syscalls,
    confinement,
    kernel_can_refuse_write_execute,
    refuse_write_execute,
    syscall_groups,
    units,
)

# services: each unit's process is given the test database by its location (tests.dburl).
pytestmark = [pytest.mark.slow, pytest.mark.services]

HOST_NAME = "koala.example.com"  # ALLOWED_HOSTS of the env example
MANAGE_PYTHON = f"{HOST_CODE}/.venv/bin/python"


# -- a fresh database, and the processes -----------------------------------------------------------
def _server_params() -> dict[str, Any]:
    params = settings.DATABASES["default"]
    return {k: params.get(k) for k in ("HOST", "PORT", "USER", "PASSWORD")}


def _admin_connection() -> psycopg.Connection[Any]:
    p = _server_params()
    return psycopg.connect(
        host=p["HOST"] or None,
        port=p["PORT"] or None,
        user=p["USER"] or None,
        password=p["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty database on the test server (a first install migrates from nothing); its URL."""
    name = f"koala_deploy_units_{secrets.token_hex(4)}"
    with _admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url({**_server_params(), "NAME": name})
    finally:
        with _admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def query(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(**libpq_params_of(url), autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()  # type: ignore[arg-type]


class Services:
    """Each unit's process in its own process group (systemd's cgroup: a stop signals all of it)."""

    def __init__(self, host: Host, logs: Path) -> None:
        self.host, self.logs = host, logs
        # What the kernel enforces of each unit's sandbox without systemd: MemoryDenyWriteExecute=
        # (Linux 6.3 or later) and SystemCallFilter= (its groups as this systemd-analyze lists them).
        tool = shutil.which("systemd-analyze")
        self.groups = syscall_groups(tool) if tool else None
        self.write_execute = kernel_can_refuse_write_execute()
        self.running: dict[str, tuple[Unit, subprocess.Popen[bytes]]] = {}
        logs.mkdir()

    def preexec(self, unit: Unit) -> Callable[[], None]:
        return confinement(unit, groups=self.groups, write_execute=self.write_execute)

    def run(self, unit: Unit, argv: list[str], *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.host.cwd(unit),
            env=self.host.environment(unit),
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=self.preexec(unit),
        )

    def start(self, unit: Unit, *, port: int | None = None) -> subprocess.Popen[bytes]:
        [argv] = self.host.commands(unit, port=port)
        log = open(self.logs / f"{unit.name}.log", "wb")
        proc = subprocess.Popen(
            argv,
            cwd=self.host.cwd(unit),
            env=self.host.environment(unit),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self.preexec(unit),
        )
        self.running[unit.name] = (unit, proc)
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def manage(self, *args: str) -> str:
        """An operator's ``manage.py`` on this host: the units' environment, from /opt/koala."""
        worker = units()["koala-worker@.service"]
        done = self.run(worker, [self.host.path(MANAGE_PYTHON), "manage.py", *args], timeout=120)
        assert done.returncode == 0, f"manage.py {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout

    def wait(self, predicate: Callable[[], object], what: str, unit_name: str) -> None:
        """wait_for, and the unit's log when it times out."""
        try:
            wait_for(predicate, timeout=60, what=what)
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}\n{unit_name}:\n{self.log(unit_name)}") from None

    def kill_all(self) -> None:
        for _, proc in self.running.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)


def group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in a process group (a unit's processes), in MB."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[2]) == pgid:
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e6


def group_tasks(pgid: int) -> int:
    """Threads of every process in a process group (what a unit's TasksMax= counts)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[2]) == pgid:
                total += int(fields[17])
        except (OSError, ValueError, IndexError):
            continue
    return total


def memory_max_mb(unit: Unit) -> float:
    value = unit.value("Service", "MemoryMax") or ""
    match = re.fullmatch(r"(\d+)([MG])", value)
    assert match, f"{unit.name}: MemoryMax={value!r} as NNNM or NG"
    return int(match[1]) * (1024**2 if match[2] == "M" else 1024**3) / 1e6


def get(port: int, path: str, **headers: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Host": HOST_NAME, **headers})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def post_json(port: int, path: str, body: str, key: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(
        "POST", path, body=body, headers={"Host": HOST_NAME, "Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    )
    response = conn.getresponse()
    data = response.read().decode(errors="replace")
    conn.close()
    return response.status, data


# -- the units serve -------------------------------------------------------------------------------
def test_each_units_command_serves_with_the_env_examples_settings(tmp_path: Path, fresh_database: str, private_redis) -> None:  # type: ignore[no-untyped-def]
    host = Host(tmp_path / "host", env_overrides={"DATABASE_URL": fresh_database, "REDIS_URL": private_redis.url})
    shipped = units()
    services = Services(host, tmp_path / "logs")
    try:
        # The migrate step: an empty database gets the whole schema, then the static files are collected.
        migrate = shipped["koala-migrate.service"]
        for argv in host.commands(migrate):
            done = services.run(migrate, argv)
            assert done.returncode == 0, f"{argv[2:]}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        applied = query(fresh_database, "SELECT count(*) FROM django_migrations WHERE app = 'workers'")[0][0]
        assert applied >= 10, "migrate built the schema"
        assert (host.state / "static" / "admin" / "css" / "base.css").is_file(), "collectstatic wrote STATIC_ROOT"

        # The web's ExecStartPre= (the settings, checked in a process that exits) passes.
        [precheck] = host.commands(shipped["koala-web.service"], key="ExecStartPre")
        done = services.run(shipped["koala-web.service"], precheck)
        assert done.returncode == 0, done.stderr[-2000:]
        port = free_port()
        web = services.start(shipped["koala-web.service"], port=port)
        worker = services.start(shipped["koala-worker@.service"])
        beat = services.start(shipped["koala-beat.service"])
        assert wait_listening(web, port, timeout=60), services.log("koala-web.service")

        # The web, as the TLS proxy reaches it: HTTPS per X-Forwarded-Proto, from loopback.
        page = get(port, "/admin/login/", **{"X-Forwarded-Proto": "https"})
        assert page.status == 200, services.log("koala-web.service")
        assert page.getheader("Strict-Transport-Security") == "max-age=31536000; includeSubDomains; preload"
        plain = get(port, "/admin/login/")
        assert (plain.status, plain.getheader("Location")) == (301, f"https://{HOST_NAME}/admin/login/")
        assert get(port, "/static/admin/css/base.css", **{"X-Forwarded-Proto": "https"}).status == 200
        # The worker API (an HTTP worker registers; it is never redirected) and its OpenAPI document.
        key = services.manage("koala_apikey", "create", "--name", "deploy test", "--scope", "worker").split()[-1]
        status, body = post_json(port, "/api/v1/workers/register", '{"name": "deploy-test", "kinds": ["noop@1"]}', key)
        assert (status, '"worker_id"' in body) == (200, True), body
        assert get(port, "/api/v1/openapi.json").status == 200

        # The worker takes a job.
        job = int(services.manage("koala_enqueue", "noop", "--input", "{}").strip())

        def job_state(job_id: int) -> str:
            return str(query(fresh_database, "SELECT state FROM workers_job WHERE id = %s", job_id)[0][0])

        services.wait(lambda: job_state(job) == "succeeded", f"job {job} to succeed", "koala-worker@.service")
        [(ran_by,)] = query(fresh_database, "SELECT worker_id FROM workers_attempt WHERE job_id = %s", job)
        assert ran_by == f"{host.hostname}.worker-1", "the unit's worker (--name %H.worker-%i) ran it"

        # An export publishes under /var/lib/koala (KOALA_EXPORT_ROOT), not inside the code.
        services.manage("createsuperuser", "--noinput", "--username", "ops", "--email", f"ops@{HOST_NAME}")
        services.manage("koala_demo_data", "--rows", "2000", "--accounts", "1", "--days", "10", "--member", "ops")
        dates = ["--from", "2026-01-01", "--to", "2026-01-10"]
        export = int(services.manage("koala_export", "create", "--user", "ops", "--account", "acme", *dates).strip())

        def export_state() -> tuple[str, int | None]:
            state, rows = query(fresh_database, "SELECT state, row_count FROM exports_export WHERE id = %s", export)[0]
            return str(state), rows

        services.wait(lambda: export_state()[0] in {"succeeded", "failed"}, f"export {export} to end", "koala-worker@.service")
        assert export_state() == ("succeeded", 2000), services.log("koala-worker@.service")
        published = host.state / "exports" / "exports" / str(export) / f"export-{export}.csv"
        assert published.is_file() and len(published.read_text().splitlines()) == 2001, "a header and 2,000 rows"

        # The beat: a delayed job is rung by nothing but its dispatcher once it falls due.
        delayed = int(services.manage("koala_enqueue", "noop", "--input", "{}", "--delay", "1").strip())
        services.wait(lambda: job_state(delayed) == "succeeded", f"the beat to ring job {delayed}", "koala-beat.service")
        assert re.search(r"beat: .* rung=[1-9]", services.log("koala-beat.service")), "the beat says it rang"

        # Each timer's oneshot service, as its timer would start it: its task runs and ends.
        for name in TICK_SERVICES:
            tick_unit = shipped[name]
            [argv] = host.commands(tick_unit)
            done = services.run(tick_unit, argv, timeout=120)
            assert done.returncode == 0, f"{name}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            assert done.stdout.startswith(f"tick {argv[-1]}: "), done.stdout
        held = query(fresh_database, "SELECT name FROM workers_ticklease WHERE expires_at IS NOT NULL ORDER BY name")
        assert held == [], "every run released its lease"

        # At rest each unit uses under half its MemoryMax and TasksMax: the bounds leave room for work.
        for name, (unit, proc) in services.running.items():
            assert proc.poll() is None, f"{name} exited: {services.log(name)}"
            used, bound = group_rss_mb(proc.pid), memory_max_mb(unit)
            tasks, tasks_max = group_tasks(proc.pid), int(unit.value("Service", "TasksMax") or 0)
            # shown with -s
            print(f"{name}: {used:.0f} MB resident at rest, MemoryMax {bound:.0f} MB; {tasks} tasks, TasksMax {tasks_max}")
            assert 0 < used < bound / 2, f"{name}: {used:.0f} MB of MemoryMax {bound:.0f} MB"
            assert 0 < tasks < tasks_max / 2, f"{name}: {tasks} tasks of TasksMax {tasks_max}"
            status = Path(f"/proc/{proc.pid}/status").read_text()
            if services.groups is not None:
                assert "\nSeccomp:\t2\n" in status, f"{name} runs under its system call filter"

        # A stop (systemd: SIGTERM to the unit's processes) ends each one cleanly within TimeoutStopSec.
        for name, (unit, proc) in services.running.items():
            os.killpg(proc.pid, signal.SIGTERM)
        for name, (unit, proc) in services.running.items():
            limit = float((unit.value("Service", "TimeoutStopSec") or "90").rstrip("s"))
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not stop within TimeoutStopSec={limit:g}: {services.log(name)}")
            # systemd counts exit 0 and death by SIGTERM as a clean stop (no OnFailure alert).
            assert code in (0, -signal.SIGTERM), f"{name} exited {code}: {services.log(name)}"
        [(ended,)] = query(fresh_database, "SELECT exit FROM workers_workerprocess WHERE name = %s", ran_by)
        assert ended == "stopped"
        assert (worker.returncode, beat.returncode) == (0, 0)

        # The other worker shapes a drop-in may give the unit (`systemctl edit koala-worker@2`),
        # in the same sandbox: the fork class (a work horse per wake) and a pool of two.
        worker_unit = shipped["koala-worker@.service"]
        [argv] = host.commands(worker_unit)
        base = argv[: argv.index("--name")]
        for shape in (["--worker-class", "fork", "--name", "fork-shape"], ["--pool", "2"]):
            job = int(services.manage("koala_enqueue", "noop", "--input", "{}").strip())
            done = services.run(worker_unit, [*base, *shape, "--burst"], timeout=120)
            assert done.returncode == 0, f"{shape}: {done.stderr[-2000:]}"
            assert job_state(job) == "succeeded", f"{shape}: {done.stderr[-2000:]}"
    finally:
        services.kill_all()


def test_the_env_examples_settings_pass_check_deploy_without_a_warning(tmp_path: Path) -> None:
    """Exactly the env example (its own URLs: check connects to nothing) and the secret from its file."""
    host = Host(tmp_path / "host", env_overrides={})
    web = units()["koala-web.service"]
    done = subprocess.run(
        [host.path(MANAGE_PYTHON), "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=host.cwd(web),
        env=host.environment(web),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout, done.stdout + done.stderr


# -- systemd-analyze calendar ----------------------------------------------------------------------
def test_systemd_analyze_calendar_previews_every_timers_schedule() -> None:
    """What docs/housekeeping.md tells an operator to run, for each shipped timer: five next
    elapses, strictly increasing, the first in the future, each on the timer's own UTC minute."""
    tool = require_tool("systemd-analyze")
    for name in TIMER_UNITS:
        calendar = units()[name].value("Timer", "OnCalendar")
        assert calendar, f"{name}: OnCalendar="
        done = subprocess.run(
            [tool, "calendar", "--iterations=5", calendar],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "TZ": "UTC"},  # the elapses printed in UTC, whatever this machine's zone
        )
        assert done.returncode == 0, f"{name}: {done.stderr}"
        elapses = re.findall(r"(?:Next elapse|Iter\. #\d): \w{3} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", done.stdout)
        assert len(elapses) == 5, done.stdout
        assert elapses == sorted(set(elapses)), f"{name}: strictly later each time: {elapses}"
        hhmm = calendar.split()[1][:5]
        assert all(e.endswith(f"{hhmm}:00") for e in elapses), f"{name}: every elapse at {hhmm} UTC: {elapses}"

    # The check can fail: systemd refuses a calendar it cannot parse.
    bad = subprocess.run([tool, "calendar", "--iterations=5", "*-*-* 25:00"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


def test_the_serving_test_runs_under_memory_deny_write_execute_on_this_kernel() -> None:
    """Linux 6.3 and later enforce it for the test above (PR_SET_MDWE); an older kernel (Debian 12's
    6.1) cannot, and this says so instead of the serving test passing without it unnoticed."""
    if not kernel_can_refuse_write_execute():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux < 6.3): MemoryDenyWriteExecute was not exercised")
    # The probe itself is the proof: a child with the refusal set could not map W+X memory.
    done = subprocess.run(
        [sys.executable, "-c", "import psycopg, uvicorn, google.protobuf, psutil, django; print('imported')"],
        preexec_fn=refuse_write_execute,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "imported\n"), done.stderr


SYSCALL_PROBE = """
import os, resource
resource.setrlimit(resource.RLIMIT_CPU, (3600, 3600))  # lower: what the work horse does
said = ["setrlimit ok"]
for name, call in (("sched_setaffinity", lambda: os.sched_setaffinity(0, {0})), ("chown", lambda: os.chown(".", -1, 0))):
    try:
        call()
        said.append(name + " allowed")
    except PermissionError:
        said.append(name + " refused")
print("; ".join(said))
"""


def test_the_serving_test_runs_each_unit_under_its_system_call_filter() -> None:
    """The filter the serving test gives each process is the unit's, and the kernel enforces it:
    the worker (and every unit, through prlimit64 in @default) may lower a resource limit;
    @resources' sched_setaffinity and @privileged's chown fail with EPERM."""
    groups = syscall_groups(require_tool("systemd-analyze"))
    shipped = units()
    worker, web = shipped["koala-worker@.service"], shipped["koala-web.service"]
    assert allowed_syscalls(worker, groups) - allowed_syscalls(web, groups) == {"setrlimit"}
    for unit in (worker, web):
        done = subprocess.run(
            [sys.executable, "-c", SYSCALL_PROBE],
            preexec_fn=confinement(unit, groups=groups, write_execute=False),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout.strip() == "setrlimit ok; sched_setaffinity refused; chown refused", (unit.name, done)
        free = subprocess.run([sys.executable, "-c", SYSCALL_PROBE], capture_output=True, text=True, timeout=60)
        assert "sched_setaffinity allowed" in free.stdout, "without the filter the probe's calls work"
