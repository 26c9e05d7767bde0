"""Bounds on every wait of a worker's (and the beat's) PostgreSQL sessions.

A worker that stalls — a network partition that keeps sockets open, SIGSTOP, a long GC —
must not be able to hold the engine hostage or act late:

- ``idle_in_transaction_session_timeout``: a transaction whose client stopped talking is
  ended by the server, releasing its locks (the job row the strict fence locked, an
  operation row's unique key). Its COMMIT can then never land, however late it arrives.
- ``lock_timeout``: a statement queued behind another session's lock gives up instead of
  waiting as long as that session lives. The engine's reclaiming statements skip locked
  rows anyway (``FOR UPDATE SKIP LOCKED``); this bounds the rest.
- ``statement_timeout``: no statement of an attempt runs longer than part of its lease.

All three are shorter than the lease (system check koala.E005), set per session when Django
opens a connection. The worker and beat processes bound every session (``bound_sessions``);
the API server bounds the sessions of the threads that serve HTTP workers' calls
(``bound_this_thread``, the hub's pool: an HTTP worker's attempt writes through them exactly as an
RQ worker's writes through its own), while its other requests (the admin, the console, the job
calls) keep PostgreSQL's defaults like migrations and management commands (a concurrent index
build or a large COPY may rightly take minutes). The export stream's own read-only connection
sets its statement timeout from the export's time limit (exports/streaming.py).

Through a transaction pooler (``KOALA_DATABASE_POOLING=transaction``, PgBouncer's
``pool_mode=transaction``) a per-session SET cannot hold: the next transaction may run on another
server session, and this one's would stay behind for another client. There the bounds must be the
login role's own settings, and ``apply_bounds`` only checks them (``check_role_bounds``, whose
refusal prints the ``ALTER ROLE`` commands). ``check_pooling`` refuses to start a process whose
setting does not match the pooler it finds (docs/scaling.md, "PgBouncer").
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from django.conf import settings
from django.db import OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from koala.env import ConfigError
from workers import sql


def _ms(seconds: float) -> str:
    return f"{max(int(seconds * 1000), 1)}ms"


def session_bounds() -> dict[str, str]:
    """The settings applied to each bounded session (for the docs, the dashboard and tests)."""
    return {
        "statement_timeout": _ms(settings.KOALA_DB_STATEMENT_TIMEOUT_SECONDS),
        "lock_timeout": _ms(settings.KOALA_DB_LOCK_TIMEOUT_SECONDS),
        "idle_in_transaction_session_timeout": _ms(settings.KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS),
    }


class SessionBoundsMissing(ConfigError):
    """Through a transaction pooler the bounds must be the role's settings, and they are not."""


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def role_settings_commands(user: str, database: str) -> list[str]:
    """The ALTER ROLE statements that give ``user``'s sessions in ``database`` the bounds."""
    return [
        f"ALTER ROLE {_quote(user)} IN DATABASE {_quote(database)} SET {name} = '{value}';"
        for name, value in session_bounds().items()
    ]


def check_role_bounds(connection: BaseDatabaseWrapper) -> None:
    """KOALA_DATABASE_POOLING=transaction: the session must already have the bounds (or tighter).

    A ``SET`` here would stay on the server session after this transaction, for whichever client
    the pooler hands it to next, while this client's next transaction may run on a session
    without it. Per-role settings hold on every server session the pooler opens for the role.
    """
    assert connection.connection is not None
    with connection.connection.cursor() as cursor:
        cursor.execute(sql.SESSION_BOUNDS_CURRENT)
        row = cursor.fetchone()
    assert row is not None
    user, database, *have = row
    wanted = {
        "statement_timeout": settings.KOALA_DB_STATEMENT_TIMEOUT_SECONDS,
        "lock_timeout": settings.KOALA_DB_LOCK_TIMEOUT_SECONDS,
        "idle_in_transaction_session_timeout": settings.KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS,
    }
    # 0 is "no limit"; a tighter limit than Koala's is fine.
    missing = [name for (name, seconds), ms in zip(wanted.items(), have, strict=True) if ms == 0 or ms > int(seconds * 1000) + 1]
    if missing:
        commands = "\n  ".join(role_settings_commands(user, database))
        raise SessionBoundsMissing(
            f"KOALA_DATABASE_POOLING=transaction: the sessions of role {user!r} lack the bounds "
            f"({', '.join(missing)}), which a transaction pooler cannot keep per session. As a superuser run:\n  "
            f"{commands}\nthen let the pooler open new server sessions (PgBouncer: RECONNECT on its admin "
            "console, or restart it). Give the web and the workers their own roles if the web's other "
            "requests must keep PostgreSQL's defaults (docs/scaling.md, PgBouncer)."
        )


def apply_bounds(connection: BaseDatabaseWrapper) -> None:
    if connection.vendor != "postgresql" or connection.connection is None:
        return
    if settings.KOALA_DATABASE_POOLING == "transaction":
        check_role_bounds(connection)
        return
    bounds = session_bounds()
    with connection.connection.cursor() as cursor:  # the raw cursor: no Django wrapping, no recursion
        cursor.execute(
            sql.SESSION_BOUNDS,
            [bounds["statement_timeout"], bounds["lock_timeout"], bounds["idle_in_transaction_session_timeout"]],
        )


_everywhere = False  # bound_sessions(): every session of this process
_this_thread = threading.local()  # bound_this_thread(): the sessions of the threads that asked


def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    # Django's connections are per thread and connection_created fires in the thread that opens one.
    if _everywhere or getattr(_this_thread, "bounded", False):
        apply_bounds(connection)


def _listen() -> None:
    connection_created.connect(_on_connection_created, dispatch_uid="koala-bounded-sessions")


def bound_sessions() -> None:
    """Bound this process's database sessions from now on (new connections and open ones).

    Also checks, once, that KOALA_DATABASE_POOLING says what is really between this process and
    PostgreSQL (``check_pooling``), so a mismatch stops the process at start, not mid-job.
    """
    global _everywhere
    check_pooling(connections["default"])
    _everywhere = True
    _listen()
    for conn in connections.all(initialized_only=True):
        apply_bounds(conn)


class PoolingMismatch(ConfigError):
    """KOALA_DATABASE_POOLING does not match what is between Koala and PostgreSQL."""


def detect_pooling(connection: BaseDatabaseWrapper) -> str:
    """What this connection goes through: ``direct``, ``session`` or ``transaction`` (pooling).

    - A pooler answers the client's startup itself, with a backend key of its own: the pid the
      client was told (``info.backend_pid``) is not the server session's ``pg_backend_pid()``.
    - A transaction pooler hands a server session back to its pool at every transaction's end, and
      PgBouncer reuses the most recently freed one first: a second client connection, opened while
      the first stays open but idle, gets the first one's server session. A session pooler (and
      PostgreSQL itself) cannot: the first client still holds it.
    """
    try:
        connection.ensure_connection()
    except OperationalError as exc:
        if "unsupported startup parameter" in str(exc):
            # PgBouncer answering: it refuses the startup options Koala sends PostgreSQL itself.
            raise PoolingMismatch(
                f"KOALA_DATABASE_POOLING={settings.KOALA_DATABASE_POOLING}, but DATABASE_URL goes through a "
                f"connection pooler that refuses startup options (PgBouncer: {exc}). Set "
                "KOALA_DATABASE_POOLING=transaction for its pool_mode=transaction (session for pool_mode=session), "
                "or point DATABASE_URL at PostgreSQL itself (docs/scaling.md, PgBouncer)."
            ) from None
        raise
    raw = connection.connection
    assert raw is not None
    with raw.cursor() as cursor:
        cursor.execute(sql.BACKEND_PID)
        row = cursor.fetchone()
    assert row is not None
    if not raw.autocommit:  # inside a transaction (a test's, a caller's): nothing to compare across
        return "direct" if row[0] == raw.info.backend_pid else "session"
    if row[0] == raw.info.backend_pid:
        return "direct"
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as other, other.cursor() as cursor:
        cursor.execute(sql.BACKEND_PID)
        second = cursor.fetchone()
    assert second is not None
    return "transaction" if second[0] == row[0] else "session"


def check_pooling(connection: BaseDatabaseWrapper) -> None:
    """Refuse to run a session feature through a transaction pooler (and say how to fix it)."""
    if connection.vendor != "postgresql":
        return
    configured = settings.KOALA_DATABASE_POOLING
    found = detect_pooling(connection)
    if configured == "direct" and found != "direct":
        raise PoolingMismatch(
            f"KOALA_DATABASE_POOLING=direct, but DATABASE_URL goes through a connection pooler ({found} pooling "
            "as far as Koala can tell: the server session's pid is not the one the connection was given). "
            f"Set KOALA_DATABASE_POOLING={found}, or point DATABASE_URL at PostgreSQL itself (docs/scaling.md, PgBouncer)."
        )
    if configured == "session" and found == "transaction":
        raise PoolingMismatch(
            "KOALA_DATABASE_POOLING=session, but DATABASE_URL goes through a transaction pooler (two client "
            "connections were served by one server session): session settings and prepared statements would "
            "leak between clients. Set KOALA_DATABASE_POOLING=transaction (docs/scaling.md, PgBouncer)."
        )


def bound_this_thread() -> None:
    """Bound the sessions this thread opens from now on, and the one it holds (a pool thread's
    initializer: the API server's threads that serve HTTP workers' calls)."""
    _this_thread.bounded = True
    with _pooling_checked_lock:
        global _pooling_checked
        if not _pooling_checked:  # once per process: the first pool thread checks for all of them
            check_pooling(connections["default"])
            _pooling_checked = True
    _listen()
    for conn in connections.all(initialized_only=True):
        apply_bounds(conn)


_pooling_checked = False
_pooling_checked_lock = threading.Lock()
