"""Scoped API keys (R19): create, revoke, and authenticate a request's ``Bearer`` key cheaply.

A raw key is ``kk_<prefix>_<secret>``: the prefix (8 hex characters) is public and names the
key everywhere (lists, audit rows); the secret is 43 characters of ``secrets.token_urlsafe``.
Koala stores only the sha256 of the whole raw key.

Authentication costs almost no queries: a worker fleet long-polls all day. A successful lookup
is cached in this process, keyed by the key's hash; every cached key is checked again against
the database in **one** query per ``KOALA_API_KEY_CACHE_SECONDS`` (however many keys are
cached), and ``last_used_at`` is written by one conditional UPDATE per minute for all the keys
this process saw. Expiry is checked against the cached ``expires_at`` on every call. A revoke
drops the key from this process's cache at once and publishes its prefix on ``revoked_channel()``
for the other processes; if Redis is down, the cache's lifetime bounds how long they accept it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from api.http import ApiError
from api.models import ApiKey
from koala.audit import AuditAction, record_audit
from koala.storable import column_length, text_problem
from workers import doorbell, targets
from workers import kinds as job_kinds
from workers.errors import UnknownName

log = logging.getLogger("koala.api.keys")


def revoked_channel() -> str:
    """Where revoke_key announces a revoked prefix (per deployment: workers.doorbell.channel)."""
    return doorbell.channel("api-keys-revoked")


LAST_USED_EVERY_SECONDS = 60.0  # last_used_at moves at most this often per key
PREFIX_CHARS = 8
_KEY_SHAPE = re.compile(r"kk_([0-9a-f]{8})_([A-Za-z0-9_-]{43})")
_PREFIX_SHAPE = re.compile(r"(?:kk_)?([0-9a-f]{8})")
_MAX_CACHED = 10_000  # a bound on the cache whatever arrives (only valid keys are ever cached)


class KeyScope(enum.StrEnum):
    WORKER = "worker"  # the worker protocol: register, acquire, heartbeat, complete, fail, operations
    EXECUTE = "execute"  # start, read and cancel jobs
    WRITE = "write"  # both
    ADMIN = "admin"  # both


# What satisfies each scope a call needs: the scope itself, or one that holds it.
_SATISFIED_BY: dict[KeyScope, tuple[KeyScope, ...]] = {
    KeyScope.WORKER: (KeyScope.WORKER, KeyScope.WRITE, KeyScope.ADMIN),
    KeyScope.EXECUTE: (KeyScope.EXECUTE, KeyScope.WRITE, KeyScope.ADMIN),
    KeyScope.WRITE: (KeyScope.WRITE, KeyScope.ADMIN),
    KeyScope.ADMIN: (KeyScope.ADMIN,),
}


class ApiKeyError(ValueError):
    """A refused key request (bad name, scope, person or expiry; an unknown or revoked key)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a key, and the person it belongs to ("" for a machine key), and
    what the key is limited to: job kinds ("name" for any version, or "name@version") and
    queues. An empty limit allows any."""

    key_id: int
    prefix: str
    name: str
    scopes: frozenset[str]
    person: str
    kinds: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()

    @property
    def actor(self) -> str:
        """The actor of what this key does: its person, or ``apikey:<prefix>`` for a machine key."""
        return self.person or f"apikey:{self.prefix}"

    def allows_kind(self, name: str, version: int) -> bool:
        return not self.kinds or name in self.kinds or f"{name}@{version}" in self.kinds

    def allows_queue(self, queue: str) -> bool:
        return not self.queues or queue in self.queues

    def allows(self, *, kind: str, version: int, queue: str) -> bool:
        """May this key serve, start, read or cancel a job of this kind, version and queue?"""
        return self.allows_kind(kind, version) and self.allows_queue(queue)


@dataclass
class _Cached:
    principal: Principal
    expires_at: datetime | None


_lock = threading.Lock()
_cache: dict[str, _Cached] = {}  # by the raw key's sha256
_checked_at = 0.0  # monotonic: when the cached keys were last checked against the database
_touched: dict[int, float] = {}  # key id -> monotonic time this process last wrote last_used_at
_used: set[int] = set()  # keys used since that write
_touch_flushed_at = 0.0


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def cache_seconds() -> float:
    return float(getattr(settings, "KOALA_API_KEY_CACHE_SECONDS", 30.0))


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="koala"'})


def _principal(row: ApiKey) -> Principal:
    return Principal(
        key_id=row.pk,
        prefix=row.prefix,
        name=row.name,
        scopes=frozenset(row.scopes),
        person=row.person.get_username() if row.person is not None else "",
        kinds=frozenset(row.kinds),
        queues=frozenset(row.queues),
    )


def _refusal(row: ApiKey, now: datetime) -> str:
    """Why ``row`` may not be used now ("" when it may)."""
    if row.revoked_at is not None:
        return f"API key kk_{row.prefix} was revoked"
    if row.expires_at is not None and row.expires_at <= now:
        return f"API key kk_{row.prefix} expired at {row.expires_at.isoformat(timespec='seconds')}"
    if row.person is not None and not row.person.is_active:
        return f"API key kk_{row.prefix} belongs to an inactive user"
    return ""


def _recheck_cached() -> None:
    """One query for every cached key: drop the revoked, expired and disowned ones. Under _lock."""
    global _checked_at
    _checked_at = time.monotonic()
    if not _cache:
        return
    ids = {entry.principal.key_id for entry in _cache.values()}
    now = timezone.now()
    rows = {row.pk: row for row in ApiKey.objects.filter(pk__in=ids).select_related("person")}
    for digest, entry in list(_cache.items()):
        row = rows.get(entry.principal.key_id)
        if row is None or _refusal(row, now):
            del _cache[digest]
        else:
            _cache[digest] = _Cached(_principal(row), row.expires_at)


def _look_up(raw: str, digest: str) -> Principal:
    """The database's answer for a key not in the cache (one query); cached when valid. Under _lock."""
    match = _KEY_SHAPE.fullmatch(raw)
    if match is None:
        raise _unauthorized("the key is not a Koala API key (kk_<prefix>_<secret>)")
    row = ApiKey.objects.select_related("person").filter(prefix=match.group(1)).first()
    # Found by its public prefix, then compared in constant time: the response time says
    # nothing about how much of a guessed secret was right.
    if row is None or not hmac.compare_digest(row.secret_hash, digest):
        raise _unauthorized("unknown API key")
    refused = _refusal(row, timezone.now())
    if refused:
        raise _unauthorized(refused)
    principal = _principal(row)
    if len(_cache) >= _MAX_CACHED:
        _cache.clear()
    _cache[digest] = _Cached(principal, row.expires_at)
    return principal


def _note_use(key_id: int) -> None:
    """Move last_used_at at most once a minute per key, for all keys in one UPDATE. Under _lock."""
    global _touch_flushed_at
    now = time.monotonic()
    _used.add(key_id)
    first_use_here = key_id not in _touched
    if not first_use_here and now - _touch_flushed_at < LAST_USED_EVERY_SECONDS:
        return
    due = {k for k in _used if now - _touched.get(k, -LAST_USED_EVERY_SECONDS) >= LAST_USED_EVERY_SECONDS}
    _used.difference_update(due)
    for k in due:
        _touched[k] = now
    if not first_use_here:
        _touch_flushed_at = now
    if not due:
        return
    stamp = timezone.now()
    # Conditional: another process may have written it within the minute; then nothing changes.
    ApiKey.objects.filter(pk__in=due).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=stamp - timedelta(seconds=LAST_USED_EVERY_SECONDS))
    ).update(last_used_at=stamp)


def authenticate(authorization: str | None) -> Principal:
    """The principal of an ``Authorization: Bearer <key>`` header value, or ApiError 401."""
    if not authorization:
        raise _unauthorized("this call needs a key: send Authorization: Bearer <key>")
    scheme, _, raw = authorization.strip().partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise _unauthorized("the Authorization header must be 'Bearer <key>'")
    if len(raw) > 200 or text_problem(raw):
        raise _unauthorized("the key is not a Koala API key (kk_<prefix>_<secret>)")
    digest = hash_key(raw)
    with _lock:
        if time.monotonic() - _checked_at >= cache_seconds():
            _recheck_cached()
        # A dict lookup by the hash: its timing can only tell about the hash, never the secret.
        entry = _cache.get(digest)
        if entry is not None and entry.expires_at is not None and entry.expires_at <= timezone.now():
            del _cache[digest]
            raise _unauthorized(
                f"API key kk_{entry.principal.prefix} expired at {entry.expires_at.isoformat(timespec='seconds')}"
            )
        principal = entry.principal if entry is not None else _look_up(raw, digest)
        _note_use(principal.key_id)
    return principal


def require(principal: Principal, scope: KeyScope) -> None:
    """ApiError 403 naming the scope unless ``principal``'s key holds ``scope`` (or one that includes it)."""
    satisfied = _SATISFIED_BY[KeyScope(scope)]
    if principal.scopes.isdisjoint(satisfied):
        others = " or ".join(f"'{s}'" for s in satisfied[1:])
        alternatives = f" (or {others})" if others else ""
        has = ", ".join(sorted(principal.scopes)) or "no scopes"
        raise ApiError(403, "forbidden", f"this call needs a key with the '{scope}' scope{alternatives}; this key has: {has}")


def _shown_limit(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


def require_kinds(principal: Principal, served: Iterable[str], *, field: str = "kinds") -> None:
    """ApiError 403 naming ``field`` unless every ``name@version`` in ``served`` is within the
    key's kinds. Checked before anything is written (register, start a job, acquire)."""
    outside = [pair for pair in served if not principal.allows_kind(*_name_version(pair))]
    if outside:
        raise ApiError(
            403,
            "forbidden",
            f"{field}: {', '.join(outside)} outside the kinds of key kk_{principal.prefix} ({_shown_limit(principal.kinds)})",
        )


def require_queues(principal: Principal, queues: Iterable[str], *, field: str = "queues") -> None:
    """ApiError 403 naming ``field`` unless every queue is within the key's queues."""
    outside = [queue for queue in queues if not principal.allows_queue(queue)]
    if outside:
        raise ApiError(
            403,
            "forbidden",
            f"{field}: {', '.join(outside)} outside the queues of key kk_{principal.prefix} ({_shown_limit(principal.queues)})",
        )


def require_serves(principal: Principal, *, served: Iterable[str], queues: Iterable[str]) -> None:
    """What a worker registers (its ``name@version`` pairs and queues) is all it will claim: both
    within the key's limits, or ApiError 403 naming the field (register, and every acquire)."""
    require_kinds(principal, served)
    require_queues(principal, queues)


def _name_version(pair: str) -> tuple[str, int]:
    name, _, version = pair.rpartition("@")
    return name, int(version)


def forget_cached(prefix: str | None = None) -> None:
    """Drop cached lookups: one key's (by prefix), or all when ``prefix`` is None."""
    global _checked_at
    with _lock:
        if prefix is None:
            _cache.clear()
            _touched.clear()
            _used.clear()
            _checked_at = 0.0
            return
        for digest, entry in list(_cache.items()):
            if entry.principal.prefix == prefix:
                del _cache[digest]


# -- services ----------------------------------------------------------------------------------


def _checked_text(field: str, value: str, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ApiKeyError(field, "cannot be empty")
    if problem := text_problem(value):
        raise ApiKeyError(field, problem)
    if len(value) > max_length:
        raise ApiKeyError(field, f"is {len(value)} characters long; at most {max_length} fit")
    return value


def checked_scopes(scopes: Iterable[str]) -> list[str]:
    given = list(scopes)
    if not given:
        raise ApiKeyError("scope", f"give at least one of {', '.join(KeyScope)}")
    known = {scope.value for scope in KeyScope}
    unknown = [s for s in given if s not in known]
    if unknown:
        raise ApiKeyError("scope", f"unknown scope {unknown[0]!r}; known: {', '.join(KeyScope)}")
    order = [scope.value for scope in KeyScope]
    return sorted(set(given), key=order.index)


def checked_kinds(given: Iterable[str]) -> list[str]:
    """A key's kinds: each a kind Koala knows, by name (any version) or ``name@version``."""
    chosen: set[str] = set()
    for item in given:
        if not isinstance(item, str) or not item.strip() or text_problem(item) or len(item) > 120:
            raise ApiKeyError("kinds", f"{str(item)[:40]!r} is not a job kind (name or name@version)")
        text = item.strip()
        name, at, version = text.rpartition("@")
        if not at:
            try:
                targets.check_kind(text, with_jobs=False)
            except UnknownName as exc:
                raise ApiKeyError("kinds", str(exc)) from None
        elif not name or not version.isascii() or not version.isdigit() or not 0 < int(version) < 2**31:
            raise ApiKeyError("kinds", f"{text!r} is not a job kind (name or name@version)")
        elif job_kinds.get(name, int(version)) is None:
            versions = sorted(k.version for k in job_kinds.served() if k.name == name)
            if not versions:
                raise ApiKeyError("kinds", str(UnknownName("kind", name, targets.registered_kinds())))
            listed = ", ".join(map(str, versions))
            raise ApiKeyError("kinds", f"job kind {name!r} has no version {version} here (versions: {listed})")
        chosen.add(text)
    return sorted(chosen)


def checked_queues(given: Iterable[str]) -> list[str]:
    """A key's queues: each a configured queue (KOALA_QUEUES)."""
    chosen: set[str] = set()
    for item in given:
        try:
            chosen.add(targets.check_queue(item.strip() if isinstance(item, str) else str(item)))
        except UnknownName as exc:
            raise ApiKeyError("queues", str(exc)) from None
    return sorted(chosen)


def create_key(
    *,
    name: str,
    scopes: Iterable[str],
    actor: str,
    person: str = "",
    expires_at: datetime | None = None,
    kinds: Iterable[str] = (),
    queues: Iterable[str] = (),
) -> tuple[ApiKey, str]:
    """A new key and its raw value (shown once: only its hash is stored); audited with it.

    ``kinds`` and ``queues`` limit what the key may serve (worker calls) and start, read and
    cancel (job calls); empty: any. Fixed for the key's life: revoke it and create another."""
    name = _checked_text("name", name, column_length(ApiKey, "name"))
    actor = _checked_text("actor", actor, column_length(ApiKey, "created_by"))
    chosen = checked_scopes(scopes)
    limited_kinds = checked_kinds(kinds)
    limited_queues = checked_queues(queues)
    owner = None
    if person:
        _checked_text("person", person, 150)
        owner = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: person}).first()
        if owner is None:
            raise ApiKeyError("person", f"no user named {person!r}")
        if not owner.is_active:
            raise ApiKeyError("person", f"user {person!r} is inactive")
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise ApiKeyError("expires_at", "must carry a time zone")
        if expires_at <= timezone.now():
            raise ApiKeyError("expires_at", "must be in the future")
    with transaction.atomic():
        prefix = secrets.token_hex(PREFIX_CHARS // 2)
        while ApiKey.objects.filter(prefix=prefix).exists():  # 1 in 4 billion per key: cheap to be sure
            prefix = secrets.token_hex(PREFIX_CHARS // 2)
        raw = f"kk_{prefix}_{secrets.token_urlsafe(32)}"
        row = ApiKey.objects.create(
            name=name,
            prefix=prefix,
            secret_hash=hash_key(raw),
            scopes=chosen,
            kinds=limited_kinds,
            queues=limited_queues,
            person=owner,
            created_by=actor,
            expires_at=expires_at,
        )
        record_audit(
            actor=actor,
            action=AuditAction.API_KEY_CREATED,
            target_type="api_key",
            target_id=prefix,
            details={
                "name": name,
                "scopes": chosen,
                "kinds": limited_kinds,
                "queues": limited_queues,
                "person": person,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return row, raw


def _announce_revoked(prefix: str) -> None:
    forget_cached(prefix)
    try:
        doorbell.redis_connection().publish(revoked_channel(), prefix)
    except Exception as exc:  # Redis down: the other processes' caches expire within their TTL
        log.warning(
            "could not announce the revoke of kk_%s on Redis (%s); other processes accept it for up to %ss",
            prefix,
            exc,
            cache_seconds(),
        )


def revoke_key(*, key_id: int, actor: str) -> ApiKey:
    """Revoke a key for good (audited). This process forgets it at commit; the others hear it on Redis."""
    actor = _checked_text("actor", actor, column_length(ApiKey, "revoked_by"))
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().filter(pk=key_id).first()
        if row is None:
            raise ApiKeyError("key", f"no API key with id {key_id}")
        if row.revoked_at is not None:
            raise ApiKeyError(
                "key",
                f"kk_{row.prefix} was already revoked by {row.revoked_by} at {row.revoked_at.isoformat(timespec='seconds')}",
            )
        row.revoked_at = timezone.now()
        row.revoked_by = actor
        row.save(update_fields=["revoked_at", "revoked_by"])
        record_audit(
            actor=actor,
            action=AuditAction.API_KEY_REVOKED,
            target_type="api_key",
            target_id=row.prefix,
            details={"name": row.name},
        )
        prefix = row.prefix
        transaction.on_commit(lambda: _announce_revoked(prefix))
    return row


def key_by_prefix(prefix: str) -> ApiKey:
    """The key a person names by its prefix (``kk_`` optional), or ApiKeyError."""
    match = _PREFIX_SHAPE.fullmatch(prefix.strip())
    if match is None:
        raise ApiKeyError("prefix", f"{prefix[:40]!r} is not a key prefix (8 hex characters, e.g. kk_1a2b3c4d)")
    row = ApiKey.objects.filter(prefix=match.group(1)).first()
    if row is None:
        raise ApiKeyError("key", f"no API key with prefix kk_{match.group(1)}")
    return row
