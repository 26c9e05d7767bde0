"""A real PgBouncer (Debian's /usr/sbin/pgbouncer, 1.18) in front of the test database.

``PgBouncer`` starts it as a subprocess on a free loopback port, ``pool_mode=transaction`` unless
told otherwise, ``auth_type=trust`` (the auth file names the users it lets through). PgBouncer
refuses to run as root, so it runs as ``nobody`` (setpriv) with its configuration, log and pid
files in a folder of its own that user can read.

``worker_role`` makes the login role the workers use through it: a member of the test's own role
(so it reaches the same tables) whose settings in the test database are Koala's session bounds
(``ALTER ROLE … IN DATABASE … SET``), what a transaction pooler needs instead of per-session SETs
(docs/scaling.md, "PgBouncer"). It is dropped again afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as psql

from tests.dburl import database_url, libpq_params
from tests.support.system_tools import require_tool

CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = {pool_mode}
max_client_conn = 500
default_pool_size = {pool_size}
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
admin_users = {admin}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    def __init__(self, params: dict[str, Any], *, users: list[str], pool_mode: str = "transaction", pool_size: int = 20) -> None:
        self.binary = require_tool("pgbouncer")
        self.params = params
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="koala-pgbouncer-"))
        self.folder.chmod(0o777)  # its log and pid files are written by nobody
        host = params.get("HOST") or "127.0.0.1"
        (self.folder / "users.txt").write_text("".join(f'"{user}" ""\n' for user in users))
        (self.folder / "pgbouncer.ini").write_text(
            CONFIG.format(
                host=host,
                port=params.get("PORT") or 5432,
                listen_port=self.port,
                folder=self.folder,
                pool_mode=pool_mode,
                pool_size=pool_size,
                admin=users[0],
            )
        )
        for name in ("users.txt", "pgbouncer.ini"):
            (self.folder / name).chmod(0o644)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        runas: list[str] = []
        if os.geteuid() == 0:  # "PgBouncer should not run as root"
            # nobody, or, for a server reached through its unix-socket folder (the embedded
            # PostgreSQL's, mode 0700), the folder's owner: the only user besides root who can
            # connect through it.
            uid, gid = self.server_socket_owner()
            who = [f"--reuid={uid}", f"--regid={gid}"] if uid is not None else ["--reuid=nobody", "--regid=nogroup"]
            runas = [require_tool("setpriv"), *who, "--clear-groups"]
        self.proc = subprocess.Popen(
            [*runas, self.binary, str(self.folder / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}: {self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log()}")

    def url(self, *, user: str | None = None) -> str:
        params = dict(self.params)
        if user is not None:
            params.update(USER=user, PASSWORD="")
        return database_url(params, host="127.0.0.1", port=self.port)

    def server_socket_owner(self) -> tuple[int | None, int | None]:
        host = self.params.get("HOST") or ""
        if not host.startswith("/"):
            return None, None
        found = Path(host).stat()
        return found.st_uid, found.st_gid

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running(params: dict[str, Any], **kwargs: Any) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(params, **kwargs).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def _admin(params: dict[str, Any]) -> psycopg.Connection[Any]:
    # libpq's keywords, not a URL: HOST may be a unix-socket folder (the embedded PostgreSQL).
    return psycopg.connect(**libpq_params(params), autocommit=True)


@contextlib.contextmanager
def worker_role(params: dict[str, Any], name: str, bounds: dict[str, str]) -> Iterator[str]:
    """A login role ``name`` in the test's own role, with ``bounds`` as its settings in the test database."""
    role, owner, database = psql.Identifier(name), psql.Identifier(params["USER"]), psql.Identifier(params["NAME"])
    with _admin(params) as conn:
        conn.execute(psql.SQL("DROP ROLE IF EXISTS {}").format(role))
        conn.execute(psql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(role, owner))
        for setting, value in bounds.items():
            conn.execute(
                psql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
                    role, database, psql.Identifier(setting), psql.Literal(value)
                )
            )
    try:
        yield name
    finally:
        with _admin(params) as conn:
            # Its sessions (PgBouncer's server connections) end first: a role with sessions cannot be dropped.
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [name])
            for _ in range(50):
                try:
                    conn.execute(psql.SQL("DROP ROLE IF EXISTS {}").format(role))
                    break
                except psycopg.errors.DependentObjectsStillInUse:
                    time.sleep(0.1)
