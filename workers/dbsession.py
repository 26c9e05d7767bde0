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
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

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


def apply_bounds(connection: BaseDatabaseWrapper) -> None:
    if connection.vendor != "postgresql" or connection.connection is None:
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
    """Bound this process's database sessions from now on (new connections and open ones)."""
    global _everywhere
    _everywhere = True
    _listen()
    for conn in connections.all(initialized_only=True):
        apply_bounds(conn)


def bound_this_thread() -> None:
    """Bound the sessions this thread opens from now on, and the one it holds (a pool thread's
    initializer: the API server's threads that serve HTTP workers' calls)."""
    _this_thread.bounded = True
    _listen()
    for conn in connections.all(initialized_only=True):
        apply_bounds(conn)
