"""Streaming rows out of PostgreSQL at COPY speed, in bounded batches.

One ``COPY (SELECT …) TO STDOUT`` runs on a dedicated, read-only connection (one statement,
so one snapshot). libpq hands over exactly one row per ``PQgetCopyData`` call, so batch
boundaries are row counts: after every ``batch_rows`` rows the caller hashes and writes the
batch, heartbeats, and checks cancellation and limits. Memory stays at one batch.

Why psycopg's low-level ``pq`` API rather than ``cursor.copy()``: the high-level iterator
cost about 1.3 µs of Python per row (its generator machinery, and garbage collection over the
row objects a batch kept alive), which made the client, not the database, the bottleneck
(docs/exports.md has the measurements). Here a row costs one C call and one append of its
bytes to the batch's ``bytearray``: libpq's copy of the row is freed at once, so a batch holds
one buffer, not tens of thousands of row objects (collecting or freeing those later cost about
as much as reading them). The connection is non-blocking and we wait in ``select()``, which
releases the GIL (so the heartbeat thread keeps running) and is exactly the "database wait" of
the timing split.
"""

from __future__ import annotations

import select
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings as django_settings
from django.db import connection
from psycopg import errors, pq

from exports import sql

Waiting = Callable[[str], AbstractContextManager[None]]


@dataclass(frozen=True)
class Batch:
    data: bytearray  # the caller's to keep: the reader starts a new buffer for the next batch
    rows: int  # data rows in this batch (the CSV header line is not a row)


class StreamError(Exception):
    """The database ended the COPY with an error (carries the SQLSTATE)."""

    def __init__(self, message: str, *, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate

    @property
    def timed_out(self) -> bool:
        return self.sqlstate == errors.QueryCanceled.sqlstate


def connection_params() -> dict[str, Any]:
    """Django's parameters for the default database, for a connection of our own."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    return params


class CopyReader:
    """Reads one ``COPY … TO STDOUT`` in batches of ``batch_rows`` rows.

    ``header`` says whether the statement's first line is a CSV header (not counted as a row).
    ``waiting("db")`` wraps every wait for the server, for the caller's timing split.
    ``session`` holds settings for the connection (time zone, date style: the output's format).
    ``connection``: run on this one (its session and transaction) instead of a new one; the
    caller keeps it open and owns it (used to compare keyset batches in one snapshot).
    ``connector``: run on the dedicated connection it opened ahead (Connector); the reader owns
    it from then on. Its session, application name and timeout are the connector's.
    """

    def __init__(
        self,
        *,
        statement: str,
        params: dict[str, Any] | tuple[Any, ...] | None = None,
        batch_rows: int,
        waiting: Waiting,
        header: bool = True,
        statement_timeout_seconds: float | None = None,
        session: dict[str, str] | None = None,
        application_name: str = "koala-export",
        connection: psycopg.Connection[Any] | None = None,
        connector: Connector | None = None,
    ) -> None:
        if batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        if connector is not None and (connection is not None or statement_timeout_seconds is not None or session):
            raise ValueError("a connector's connection has its own session and timeout")
        self._statement = statement
        self._params = params
        self._batch_rows = batch_rows
        self._waiting = waiting
        self._header = header
        self._timeout = statement_timeout_seconds
        self._session = dict(session or {})
        self._application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None
        self._borrowed = connection
        self._connector = connector
        self._finished = False

    def __enter__(self) -> CopyReader:
        with self._waiting("db"):
            if self._borrowed is not None:
                self._conn = conn = self._borrowed
            elif self._connector is not None:
                self._conn = conn = self._connector.take()
            else:
                self._conn = conn = dedicated_connection(
                    session=self._session, statement_timeout_seconds=self._timeout, application_name=self._application_name
                )
            try:
                _begin_local(conn)
                with psycopg.ClientCursor(conn) as cursor:
                    # COPY takes no bind parameters: values are quoted client-side by psycopg.
                    query = cursor.mogrify(self._statement, self._params)
                pgconn = conn.pgconn
                pgconn.nonblocking = 1
                pgconn.send_query(query.encode())
                while pgconn.flush():
                    select.select([], [pgconn.socket], [])
                self._await_result()
                result = pgconn.get_result()
                if result is None or result.status != pq.ExecStatus.COPY_OUT:
                    self._finished = True  # nothing is streaming: no cancel needed
                    raise _error(result, pgconn)
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not self._finished and not conn.closed:
            # Stopped mid-stream (cancel, limit, error): tell the server to stop producing.
            try:
                conn.cancel_safe(timeout=2)
            except (psycopg.Error, OSError):
                pass
        if conn is self._borrowed:
            if not conn.closed:
                conn.pgconn.nonblocking = 0
            return
        if not conn.closed and conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            # The transaction-pooling case's own transaction: ended here, so the pooler gets
            # its server session back clean rather than closing it for a client gone mid-transaction.
            try:
                conn.pgconn.nonblocking = 0
                conn.execute(sql.ROLLBACK)
            except (psycopg.Error, OSError):
                pass
        conn.close()

    def _await_result(self) -> None:
        assert self._conn is not None
        pgconn = self._conn.pgconn
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                return
            select.select([pgconn.socket], [], [])

    def batches(self) -> Iterator[Batch]:
        assert self._conn is not None, "use CopyReader as a context manager"
        pgconn = self._conn.pgconn
        get = pgconn.get_copy_data
        sock = pgconn.socket
        size = self._batch_rows
        skip = 1 if self._header else 0
        limit = size + skip
        buffer = bytearray()
        lines = 0
        while True:
            nbytes, data = get(1)
            if nbytes > 0:  # the hot path: copy the row's bytes and let libpq's buffer go at once
                buffer += data
                lines += 1
                if lines >= limit:
                    yield Batch(data=buffer, rows=lines - skip)
                    buffer = bytearray()  # the batch's bytes are the caller's to keep
                    lines, skip, limit = 0, 0, size
                continue
            if nbytes == 0:  # nothing buffered: wait for the server
                with self._waiting("db"):
                    select.select([sock], [], [])
                    pgconn.consume_input()
                continue
            break  # -1: the COPY is complete; -2: an error, reported by the final result
        with self._waiting("db"):
            self._await_result()
            result = pgconn.get_result()
            while pgconn.get_result() is not None:
                pass
        if result is None or result.status != pq.ExecStatus.COMMAND_OK:
            raise _error(result, pgconn)
        self._finished = True
        if lines:  # the last, shorter batch (or the header alone: an empty export)
            yield Batch(data=buffer, rows=lines - skip)


def dedicated_connection(
    *, session: dict[str, str], statement_timeout_seconds: float | None, application_name: str
) -> psycopg.Connection[Any]:
    """A new autocommit connection of the reader's own, to Django's default database."""
    return _open(_dedicated_params(session, statement_timeout_seconds, application_name))


# Through a transaction pooler (KOALA_DATABASE_POOLING=transaction) the settings cannot be startup
# options (PgBouncer 1.18 refuses them) nor session settings (the next transaction may run on
# another server session, and this one's would stay behind for another client): the COPY runs in
# a read-only transaction of its own that sets them first, local to it.
_LOCAL_SETTINGS = "_koala_local_settings"


def _dedicated_params(session: dict[str, str], timeout: float | None, application_name: str) -> dict[str, Any]:
    # Read-only by construction; the server stops the statement at the time limit even if it
    # stalls before the first row (a batch boundary would never come). Sent as startup
    # options: no extra round trip per setting.
    settings = {"default_transaction_read_only": "on", **session}
    if timeout is not None:
        settings["statement_timeout"] = f"{max(int(timeout * 1000), 1)}ms"
    params = connection_params()
    params["application_name"] = application_name
    if django_settings.KOALA_DATABASE_POOLING == "transaction":
        # The pooler's sessions carry the workers' role bounds; like a direct dedicated connection
        # (PostgreSQL's default), no time limit means none.
        params[_LOCAL_SETTINGS] = {"statement_timeout": "0", **settings}
        return params
    options = [params.get("options", "")] + [f"-c {name}={_escape(value)}" for name, value in settings.items()]
    params["options"] = " ".join(o for o in options if o)
    return params


# A dedicated connection -> the settings its COPY's transaction sets first (transaction pooling).
_pending_local: weakref.WeakKeyDictionary[psycopg.Connection[Any], dict[str, str]] = weakref.WeakKeyDictionary()


def _open(params: dict[str, Any]) -> psycopg.Connection[Any]:
    params = dict(params)
    local = params.pop(_LOCAL_SETTINGS, None)
    conn: psycopg.Connection[Any] = psycopg.connect(**params, autocommit=True)
    if local is not None:
        _pending_local[conn] = local
    return conn


def _begin_local(conn: psycopg.Connection[Any]) -> None:
    """Just before the COPY, not when the connection opens (the Connector opens it ahead): a
    transaction left idle meanwhile would meet the role's idle_in_transaction_session_timeout."""
    local = _pending_local.pop(conn, None)
    if local is None:
        return
    conn.execute(sql.BEGIN_READ_ONLY)
    for name, value in local.items():
        conn.execute(sql.SET_LOCAL, [name, value])


class Connector:
    """Opens a reader's dedicated connection on a thread of its own, ahead of the COPY.

    A new session costs several milliseconds (TCP, the server starting a backend,
    authentication) of waiting for nothing but the server; started early, it overlaps the
    caller's other work before the COPY (an export's checks and fenced writes) instead of
    adding to it. The thread only waits in libpq (psycopg releases the GIL there).
    ``statement_timeout_seconds`` starts counting when the COPY starts, so the caller gives
    what remains at the connector's start: the server's stop can only come later than the
    caller's own limit, by the time between the two, never earlier.
    ``take()`` hands the connection over (or raises what opening it raised); ``close()``
    closes a connection nobody took.
    """

    def __init__(self, *, session: dict[str, str], statement_timeout_seconds: float | None, application_name: str) -> None:
        # Django's connection settings are read here, on the caller's thread.
        self._params = _dedicated_params(dict(session), statement_timeout_seconds, application_name)
        self._conn: psycopg.Connection[Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, name="koala-export-connect", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            self._conn = _open(self._params)
        except BaseException as exc:  # handed to the caller by take()
            self._error = exc

    def take(self) -> psycopg.Connection[Any]:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        conn, self._conn = self._conn, None
        if conn is None:
            raise psycopg.InterfaceError("the connector's connection was already taken")
        return conn

    def close(self) -> None:
        self._thread.join()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _escape(value: str) -> str:
    """A value inside libpq's ``options``: spaces and backslashes are backslash-escaped."""
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def _error(result: pq.abc.PGresult | None, pgconn: pq.abc.PGconn) -> Exception:
    if pgconn.status == pq.ConnStatus.BAD:
        return psycopg.OperationalError(f"the database connection was lost: {pgconn.get_error_message()}")
    if result is None:
        return psycopg.OperationalError("the COPY ended without a result")
    sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
    message = (result.error_message or b"").decode("utf-8", "replace").strip() or "COPY failed"
    return StreamError(message, sqlstate=sqlstate.decode() if sqlstate else None)
