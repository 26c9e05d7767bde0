"""Pause switches: global, per queue or per kind, for every tenant or one, in drain or stop mode;
and the circuit breaker.

A pause is a row. The claim statement refuses jobs covered by a live pause, so "nothing
new is claimed" holds for every worker at once, from the next claim on. A stop pause
is also read by each running attempt's heartbeat, which cancels the body and releases
the job without using an attempt. Paused jobs simply stay queued. A pause with a tenant
holds only the jobs whose input names that tenant (a budget of that tenant's overshoot
pauses that tenant's work, not everybody's).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from workers import sql, targets
from workers.errors import SafetyError
from workers.models import Pause, PauseMode, PauseSource, Scope


def _live() -> Q:
    return Q(lifted_at__isnull=True) & (Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))


def active_pauses() -> list[Pause]:
    return list(Pause.objects.filter(_live()).order_by("scope", "target", "tenant"))


def pauses_of_every_tenant() -> list[Pause]:
    """The live pauses that hold their scope for every tenant: the ones a worker may skip a queue
    or a kind for up front. A tenant's pause holds only some of a kind's jobs; the claim
    statement passes over those itself, and skipping the kind would starve the other tenants."""
    return [row for row in active_pauses() if not row.tenant]


def lift_expired() -> int:
    """Mark expired pauses lifted (so the scope can be paused again and history reads right)."""
    now = timezone.now()
    return Pause.objects.filter(lifted_at__isnull=True, expires_at__lte=now).update(lifted_at=now, lifted_by="expiry")


def pause(
    *,
    scope: str,
    reason: str,
    actor: str,
    target: str = "",
    tenant: str = "",
    mode: str = PauseMode.DRAIN,
    expires_at: datetime | None = None,
    source: str = PauseSource.MANUAL,
) -> Pause:
    """Pause a scope, for every tenant (``tenant`` empty) or for one. Pausing a scope that is
    already paused for that tenant is an error naming the live pause.

    A person may pause only a queue or kind Koala knows (workers.targets): a typo must not
    leave a live pause that holds nothing. The machine's pauses (circuit breaker, budget)
    name what their rows name (a kind with crashed jobs, a budget's scope and tenant) and are
    not second-guessed: refusing them would silently drop a safety stop.
    """
    if source == PauseSource.MANUAL:
        targets.check_scope(scope, target)
        targets.check_tenant(tenant)
    elif scope not in Scope.values:
        raise SafetyError(f"unknown scope {scope!r}; known: {', '.join(Scope.values)}.")
    if scope == Scope.GLOBAL and target:
        raise SafetyError("a global pause takes no target.")
    if scope != Scope.GLOBAL and not target:
        raise SafetyError(f"a {scope} pause needs the {scope} name.")
    if mode not in PauseMode.values:
        raise SafetyError(f"unknown pause mode {mode!r}; use drain or stop.")
    if source not in PauseSource.values:
        raise SafetyError(f"unknown pause source {source!r}.")
    if not reason or not reason.strip():
        raise SafetyError("a pause needs a reason.")
    if expires_at is not None and expires_at <= timezone.now():
        raise SafetyError("the pause's expiry is in the past.")
    lift_expired()
    try:
        with transaction.atomic():
            row = Pause.objects.create(
                scope=scope,
                target=target,
                tenant=tenant,
                mode=mode,
                source=source,
                reason=redact_text(reason.strip(), limit=1000),
                created_by=actor,
                expires_at=expires_at,
            )
            record_audit(
                actor=actor,
                action=AuditAction.PAUSE,
                target_type="pause",
                target_id=row.pk,
                details={
                    "scope": scope,
                    "target": target,
                    "tenant": tenant,
                    "mode": mode,
                    "source": source,
                    "reason": row.reason,
                },
            )
    except IntegrityError:
        # pause_one_live_per_scope decided: a concurrent or earlier pause holds this scope and tenant.
        live = Pause.objects.filter(scope=scope, target=target, tenant=tenant, lifted_at__isnull=True).first()
        covers = Pause(scope=scope, target=target, tenant=tenant).covers
        raise SafetyError(
            f"{covers} is already paused (pause {live.pk if live else '?'}, {live.mode if live else ''}); "
            "resume it first or change that pause."
        ) from None
    return row


def resume(*, pause_id: int, actor: str, note: str = "") -> Pause:
    """Lift a pause; its queued jobs are rung at once."""
    with transaction.atomic():
        updated = Pause.objects.filter(pk=pause_id, lifted_at__isnull=True).update(lifted_at=timezone.now(), lifted_by=actor)
        row = Pause.objects.filter(pk=pause_id).first()
        if row is None:
            raise SafetyError(f"pause {pause_id} does not exist.")
        if not updated:
            raise SafetyError(f"pause {pause_id} was already lifted by {row.lifted_by or 'someone'} at {row.lifted_at}.")
        record_audit(
            actor=actor,
            action=AuditAction.RESUME,
            target_type="pause",
            target_id=pause_id,
            details={"scope": row.scope, "target": row.target, "tenant": row.tenant, "note": redact_text(note, limit=500)},
        )
        from workers.services.maintenance import dispatch

        transaction.on_commit(dispatch)
    return row


def stop_requested(*, kind: str, queue: str, tenant: str) -> bool:
    """True if a live stop-mode pause covers a job of this kind, queue and tenant (read by heartbeats)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.STOP_REQUESTED, {"queue": queue, "kind": kind, "tenant": tenant})
        (found,) = cursor.fetchone()
    return bool(found)


def trip_breakers(*, threshold: int | None = None) -> list[Pause]:
    """Pause (drain) every kind whose last ``threshold`` finished attempts all crashed.

    A crash is an orphaned attempt (the worker died or hung) or a fatal failure (an
    unclassified exception). Only a streak newer than the kind's last breaker pause
    trips it again, so an operator's resume is not undone by the same old streak.
    """
    limit = int(settings.KOALA_BREAKER_THRESHOLD if threshold is None else threshold)
    if limit <= 0:
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql.CRASH_STREAKS, [limit, limit])
        streaks = cursor.fetchall()
    tripped: list[Pause] = []
    for kind, last_crash in streaks:
        last_trip = (
            Pause.objects.filter(scope=Scope.KIND, target=kind, source=PauseSource.CIRCUIT_BREAKER)
            .order_by("-created_at")
            .values_list("created_at", flat=True)
            .first()
        )
        if last_trip is not None and last_trip >= last_crash:
            continue
        # Already held for everyone; a pause of one tenant does not stop the others' crashes.
        if Pause.objects.filter(_live(), scope=Scope.KIND, target=kind, tenant="").exists():
            continue
        try:
            tripped.append(
                pause(
                    scope=Scope.KIND,
                    target=kind,
                    mode=PauseMode.DRAIN,
                    source=PauseSource.CIRCUIT_BREAKER,
                    actor="circuit-breaker",
                    reason=f"circuit breaker: the last {limit} attempts of {kind} crashed or failed fatally; "
                    "look at the failures, fix the cause, then resume",
                )
            )
        except SafetyError:
            continue  # another beat replica tripped it first
    return tripped
