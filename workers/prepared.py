"""The engine's hot statements run prepared (``sql.PREPARED``): parsed and planned once per session.

Django binds values on the client (psycopg's ClientCursor), and psycopg's own prepared
statements need server-side binding, which would change how every ORM query is sent. So the
engine prepares its few hot statements itself, in SQL: a session's cursors are of the class
below, which looks each statement up by its text in ``sql.PREPARED``; the first time one runs on
a session it sends ``PREPARE name AS …`` (the statement with $1..$n), and from then on
``EXECUTE name(…)`` with the same values, bound as before. Callers, ``connection.execute_wrapper``
and the debug SQL log all keep seeing the statement itself.

Why it is safe:

- a PREPARE that fails (a schema without the table yet: ``migrate`` on an empty database) only
  marks that statement unprepared on that session, and it runs as plain text; inside a
  transaction the PREPARE runs under a savepoint, so the failure aborts nothing;
- prepared statements are not transactional: a rollback after the PREPARE keeps it;
- each session keeps its own (a new connection prepares again); a prepared statement's plan is
  invalidated by PostgreSQL itself when a migration changes a table it reads;
- a statement whose cached plan can no longer serve (``cached plan must not change result type``
  after a schema change, ``prepared statement … does not exist`` after a ``DISCARD ALL``) fails
  that one call, as a dropped connection would, and is prepared again on the next.

``KOALA_PREPARED_STATEMENTS=false`` turns it off: behind a pooler that hands each transaction a
different server session (PgBouncer's transaction mode), a statement prepared on one session is
missing on the next (docs/configuration.md).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.base import Cursor
from django.db.backends.signals import connection_created

from workers import sql

if TYPE_CHECKING:  # Django's stubs leave its cursor class untyped; at run time it is psycopg's ClientCursor
    _DjangoCursor = psycopg.ClientCursor[Any]
else:
    _DjangoCursor = Cursor

log = logging.getLogger(__name__)

# psycopg connection -> {statement name: prepared on it (True), refused (False), or to be
# replaced (STALE: its cached plan can no longer serve)}.
_sessions: weakref.WeakKeyDictionary[Any, dict[str, bool | str]] = weakref.WeakKeyDictionary()
STALE = "stale"


def _is_stale(exc: psycopg.Error) -> bool:
    """A prepared statement the session can no longer run as it is: gone (a ``DISCARD ALL``), or
    its cached plan's columns changed under it (a migration altered the table it returns)."""
    if isinstance(exc, psycopg.errors.InvalidSqlStatementName):
        return True
    return isinstance(exc, psycopg.errors.FeatureNotSupported) and "cached plan" in str(exc)


class PreparingCursor(_DjangoCursor):
    """Django's PostgreSQL cursor that runs ``sql.PREPARED``'s statements prepared."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        prepared = sql.PREPARED.get(query) if isinstance(query, str) else None
        if prepared is None or params is None or not self._ready(prepared):
            return super().execute(query, params, **kwargs)
        try:
            return super().execute(prepared.execute, params, **kwargs)
        except psycopg.Error as exc:
            if _is_stale(exc):
                # This call fails, as it would on a dropped connection (its transaction is
                # aborted, so nothing more can run in it); the next one prepares it anew.
                _sessions.setdefault(self.connection, {})[prepared.name] = STALE
            raise

    def _ready(self, prepared: sql.Prepared) -> bool:
        known = _sessions.setdefault(self.connection, {})
        state = known.get(prepared.name)
        if state is None or state == STALE:
            state = known[prepared.name] = self._prepare(prepared, replace=state == STALE)
        return state is True

    def _prepare(self, prepared: sql.Prepared, *, replace: bool) -> bool:
        # Outside a transaction (autocommit) a failed PREPARE harms nothing; inside one it would
        # abort the caller's transaction, so it runs under a savepoint there.
        guarded = not self.connection.autocommit
        steps = [prepared.deallocate, prepared.prepare] if replace else [prepared.prepare]
        try:
            if guarded:
                super().execute(sql.PREPARE_SAVEPOINT)
            for step in steps:
                try:
                    super().execute(step)
                except psycopg.errors.InvalidSqlStatementName:
                    if step != prepared.deallocate:
                        raise
                    # Already gone (DISCARD ALL): nothing to replace. The failed DEALLOCATE
                    # aborted the savepoint's work, so start it again.
                    if guarded:
                        super().execute(sql.PREPARE_ROLLBACK)
            if guarded:
                super().execute(sql.PREPARE_RELEASE)
            return True
        except psycopg.Error as exc:
            if guarded and not self.connection.closed:
                super().execute(sql.PREPARE_ROLLBACK)
            log.debug("statement %s runs unprepared on this session: %s", prepared.name, exc)
            return False


def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if settings.KOALA_PREPARED_STATEMENTS and connection.vendor == "postgresql":
        connection.connection.cursor_factory = PreparingCursor


def install() -> None:
    """Run the hot statements prepared on every session opened from now on (WorkersConfig.ready)."""
    connection_created.connect(_on_connection_created, dispatch_uid="koala-prepared-statements")
