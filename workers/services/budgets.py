"""Budgets: limits per scope and period, enforced where work is claimed and where money is spent.

- Spend and requests are *reserved* before an outbound call with one conditional UPDATE
  over every budget that applies; the row count decides. Concurrent workers can never
  overshoot, because each reservation re-checks the row it locks and is a true upper
  bound of its call's cost (for model calls: ``price_tokens`` of prompt bytes in and
  ``max_tokens`` out). A bill above its reservation anyway is returned by ``settle``
  and pauses the budget's scope (``pause_overshot``).
- Concurrency is checked at claim time under a lock on the budget row, counting running
  jobs from the job table itself (a crashed worker cannot leak a counter).
- Attempts and run time are counted per period for budgets that limit them.
- An exhausted budget parks the job with a visible reason; the beat unparks it when the
  period rolls over or a limit is raised.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from koala.audit import AuditAction, record_audit
from koala.storable import column_range
from workers import sql, targets
from workers.errors import SafetyError
from workers.models import Budget, BudgetUsage, Job, JobState, ModelPrice, ParkReason, Pause, PauseMode, PauseSource
from workers.services import pauses
from workers.services.jobs import unpark_jobs

LIMIT_FIELDS = ("spend_limit_minor", "request_limit", "concurrency_limit", "run_seconds_limit", "attempt_limit")


class BudgetExhausted(Exception):
    """A reservation or claim found a budget without room. Carries what unparks the job."""

    def __init__(self, *, budget_id: int, name: str, limit: str, need: int, period: date, detail: str) -> None:
        super().__init__(detail)
        self.budget_id = budget_id
        self.name = name
        self.limit = limit
        self.need = need
        self.period = period
        self.detail = detail

    @property
    def parked_on(self) -> dict[str, Any]:
        return {"budget_id": self.budget_id, "limit": self.limit, "need": self.need, "period": self.period.isoformat()}


class ClaimBlocked(Exception):
    """A concurrency limit is full: leave the job queued and skip this scope for now."""

    def __init__(self, *, scope: str, target: str, name: str) -> None:
        super().__init__(f"budget {name}: concurrency limit reached")
        self.scope = scope
        self.target = target
        self.name = name


# -- administration (people) -------------------------------------------------------------------


# What each limit's column holds: a bigger number would fail in the database, not here.
_LIMIT_MAXIMUM = {name: column_range(Budget, name)[1] for name in LIMIT_FIELDS}
_PRICE_MAXIMUM = column_range(ModelPrice, "input_minor_per_mtok")[1]


def _whole_number(name: str, value: Any, *, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SafetyError(f"{name} must be a whole number or empty, not {value!r}.")
    try:
        number = int(value)
    except ValueError:
        raise SafetyError(f"{name} must be a whole number or empty, not {str(value)[:40]!r}.") from None
    if number < 0:
        raise SafetyError(f"{name} cannot be negative (got {number}).")
    if number > maximum:
        raise SafetyError(f"{name} must be at most {maximum}.")
    return number


def _check_limits(limits: dict[str, Any]) -> dict[str, int | None]:
    clean: dict[str, int | None] = {}
    for name, value in limits.items():
        if name not in LIMIT_FIELDS:
            raise SafetyError(f"unknown budget limit {name!r}; limits are: {', '.join(LIMIT_FIELDS)}.")
        clean[name] = None if value is None or value == "" else _whole_number(name, value, maximum=_LIMIT_MAXIMUM[name])
    return clean


def create_budget(
    *,
    name: str,
    scope: str,
    actor: str,
    target: str = "",
    tenant: str = "",
    timezone: str = "UTC",
    currency: str | None = None,
    pause_on_exhaust: bool = False,
    **limits: Any,
) -> Budget:
    """Create a budget. Limits are whole numbers (money in minor units of KOALA_COST_CURRENCY, the
    budget's currency); None means no limit. ``currency``, when given, must be that currency."""
    if not name.strip():
        raise SafetyError("a budget needs a name.")
    targets.check_scope(scope, target)
    targets.check_tenant(tenant)
    zone = timezone
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a path
        raise SafetyError(f"unknown time zone {zone!r} (use an IANA name such as Europe/Paris).") from None
    cost_currency = settings.KOALA_COST_CURRENCY
    if currency is not None and currency.strip().upper() != cost_currency:
        # Costs are priced and reserved in the cost currency and no exchange rate exists: a limit
        # in another currency would be compared with amounts it is not in.
        raise SafetyError(
            f"budgets are in KOALA_COST_CURRENCY ({cost_currency}), the currency every cost is priced in; "
            f"Koala converts nothing, so a budget in {currency[:10]!r} cannot be kept. Give the limits in {cost_currency}."
        )
    clean = _check_limits(limits)
    with transaction.atomic():
        # The unique name decides, not a look first: two people creating the same budget at
        # once both see no such name, and the second INSERT waits for the first and fails.
        try:
            with transaction.atomic():
                budget = Budget.objects.create(
                    name=name,
                    scope=scope,
                    target=target,
                    tenant=tenant,
                    timezone=zone,
                    pause_on_exhaust=pause_on_exhaust,
                    created_by=actor,
                    **clean,
                )
        except IntegrityError:
            if Budget.objects.filter(name=name).exists():
                raise SafetyError(f"a budget named {name!r} already exists.") from None
            raise  # another constraint: the checks above should have caught it
        record_audit(
            actor=actor,
            action=AuditAction.BUDGET_CREATE,
            target_type="budget",
            target_id=budget.pk,
            details={"name": name, "scope": scope, "target": target, "tenant": tenant, **clean},
        )
    return budget


def update_budget(*, budget_id: int, actor: str, pause_on_exhaust: bool | None = None, **limits: Any) -> Budget:
    """Change limits. Raising a limit lets the beat unpark the jobs it held."""
    clean = _check_limits(limits)
    with transaction.atomic():
        try:
            budget = Budget.objects.select_for_update().get(pk=budget_id)
        except Budget.DoesNotExist:
            raise SafetyError(f"budget {budget_id} does not exist.") from None
        before = {name: getattr(budget, name) for name in clean}
        for name, value in clean.items():
            setattr(budget, name, value)
        if pause_on_exhaust is not None:
            budget.pause_on_exhaust = pause_on_exhaust
        budget.save()
        record_audit(
            actor=actor,
            action=AuditAction.BUDGET_UPDATE,
            target_type="budget",
            target_id=budget.pk,
            details={"before": before, "after": clean, "pause_on_exhaust": budget.pause_on_exhaust},
        )
    return budget


def period_for(budget: Budget, *, at: Any = None) -> date:
    moment = at or timezone.now()
    return moment.astimezone(zoneinfo.ZoneInfo(budget.timezone)).date()


def usage_for(*, budget: Budget, on: date | None = None) -> BudgetUsage:
    """The usage row of a period (today in the budget's zone by default); unsaved zeros if none yet."""
    period = on or period_for(budget)
    found = BudgetUsage.objects.filter(budget=budget, period=period).first()
    return found or BudgetUsage(budget=budget, period=period)


def set_model_price(*, model: str, input_minor_per_mtok: int, output_minor_per_mtok: int, actor: str) -> ModelPrice:
    if not model.strip():
        raise SafetyError("a price needs a model name.")
    price_in = _whole_number("input_minor_per_mtok", input_minor_per_mtok, maximum=_PRICE_MAXIMUM)
    price_out = _whole_number("output_minor_per_mtok", output_minor_per_mtok, maximum=_PRICE_MAXIMUM)
    with transaction.atomic():
        price, created = ModelPrice.objects.update_or_create(
            model=model,
            defaults={
                "input_minor_per_mtok": price_in,
                "output_minor_per_mtok": price_out,
                "updated_by": actor,
            },
        )
        record_audit(
            actor=actor,
            action=AuditAction.PRICE_SET,
            target_type="model_price",
            target_id=model,
            details={"input": price.input_minor_per_mtok, "output": price.output_minor_per_mtok, "created": created},
        )
    return price


def model_price(model: str) -> ModelPrice | None:
    """The price table's row for ``model``; None when it has no price."""
    return ModelPrice.objects.filter(model=model).first()


def price_tokens(price: ModelPrice, *, input_tokens: int, output_tokens: int) -> int:
    """Cost in minor units of a call's tokens at ``price``, rounded up (integer arithmetic).

    Monotone in both counts, so the price of an upper bound of the tokens is an upper
    bound of the cost: that is what makes a model call's reservation a true bound.
    """
    if input_tokens < 0 or output_tokens < 0:
        raise ValueError("token counts cannot be negative")
    total = input_tokens * price.input_minor_per_mtok + output_tokens * price.output_minor_per_mtok
    return -(-total // 1_000_000)


def price_usage(usage: dict[str, Any] | None) -> int | None:
    """Cost in minor units of ``{"model", "input_tokens", "output_tokens"}``, rounded up;
    None when the model has no price (the caller then keeps its estimate)."""
    if not usage or "model" not in usage:
        return None
    price = model_price(str(usage["model"]))
    if price is None:
        return None
    return price_tokens(
        price, input_tokens=int(usage.get("input_tokens") or 0), output_tokens=int(usage.get("output_tokens") or 0)
    )


# -- enforcement (the machine loop) -------------------------------------------------------------


def _params(kind: str, queue: str, tenant: str) -> dict[str, Any]:
    return {"kind": kind, "queue": queue, "tenant": tenant or ""}


def applicable(*, kind: str, queue: str, tenant: str) -> list[Budget]:
    """The budgets that cover a job of this kind, queue and tenant, in id order."""
    return list(Budget.objects.raw(sql.APPLICABLE_BUDGETS, _params(kind, queue, tenant)))


def _ensure_usage(cursor: Any, statement: str, params: dict[str, Any]) -> list[tuple[int, str, date]]:
    """Create this period's usage rows (sql.ENSURE_USAGE_*); returns (budget id, name, period)."""
    cursor.execute(statement, params)
    return list(cursor.fetchall())


def reserve(*, kind: str, queue: str, tenant: str, estimate_minor: int) -> list[list[int]]:
    """Reserve ``estimate_minor`` and one request on every applicable budget, or none.

    Call inside the transaction that records the operation as in flight. Returns the
    reservations ``[[usage_id, minor], …]`` to settle or release later; raises
    BudgetExhausted (the caller's transaction then rolls back, reserving nothing).
    """
    params = {**_params(kind, queue, tenant), "est": estimate_minor}
    with connection.cursor() as cursor:
        applicable = _ensure_usage(cursor, sql.ENSURE_USAGE_APPLICABLE, params)
        if not applicable:
            return []
        # The conditional UPDATE is the decision: PostgreSQL re-checks each row's condition
        # after taking its lock, so two workers racing for the last unit cannot both pass.
        cursor.execute(sql.RESERVE, params)
        granted = {budget_id: usage_id for usage_id, budget_id in cursor.fetchall()}
        for budget_id, name, period in applicable:
            if budget_id not in granted:
                raise _exhausted(budget_id=budget_id, name=name, period=period, need=estimate_minor, limits=("requests", "spend"))
    return [[usage_id, estimate_minor] for usage_id in granted.values()]


def _room(budget: Budget, usage: BudgetUsage, limit: str, need: int) -> bool:
    """Whether ``limit`` of ``budget`` still admits one more call needing ``need`` (the SQL's rule, in Python)."""
    if limit == "spend":
        return budget.spend_limit_minor is None or usage.spent_minor + usage.reserved_minor + need <= budget.spend_limit_minor
    if limit == "requests":
        return budget.request_limit is None or usage.requests + 1 <= budget.request_limit
    if limit == "attempts":
        return budget.attempt_limit is None or usage.attempts < budget.attempt_limit
    if limit == "run_seconds":
        return budget.run_seconds_limit is None or usage.run_seconds < budget.run_seconds_limit
    return True


def _exhausted(*, budget_id: int, name: str, period: date, need: int, limits: tuple[str, str]) -> BudgetExhausted:
    """Explain a refusal: the first of ``limits`` without room (the last one if a race already freed it)."""
    budget = Budget.objects.get(pk=budget_id)
    usage = usage_for(budget=budget, on=period)
    limit = next((candidate for candidate in limits if not _room(budget, usage, candidate, need)), limits[-1])
    detail = {
        "requests": f"request limit {budget.request_limit} reached",
        "spend": f"spend limit {budget.spend_limit_minor} {budget.currency} (minor units) would be exceeded: "
        f"{usage.spent_minor} spent + {usage.reserved_minor} reserved + {need} needed",
        "attempts": f"attempt limit {budget.attempt_limit} reached",
        "run_seconds": f"run-time limit {budget.run_seconds_limit}s reached",
    }[limit]
    return BudgetExhausted(
        budget_id=budget_id, name=name, limit=limit, need=need, period=period, detail=f"budget {name!r} for {period}: {detail}"
    )


def _in_lock_order(reservations: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Reservations ``[[usage_id, minor], …]`` in usage id order, the one order in which every
    statement locks usage rows (sql._LOCK_USAGE says why): a settlement or a release racing a
    reservation over overlapping budgets can then never hold a row the other waits for."""
    return sorted((int(usage_id), int(minor)) for usage_id, minor in reservations)


@dataclass(frozen=True)
class Overshoot:
    """A settled call that cost more than it had reserved on one budget's usage row."""

    usage_id: int
    budget_id: int
    reserved_minor: int
    actual_minor: int

    @property
    def minor(self) -> int:
        return self.actual_minor - self.reserved_minor


def settle(*, reservations: Sequence[Sequence[int]], actual_minor: int) -> list[Overshoot]:
    """Turn reservations into spend: the actual cost, which is at most the reservation when
    the estimate was a true bound (the reservation checked the cap, so spend stays under it).

    Spend is what was billed, always, even past a cap: a cost above its reservation is
    returned as an Overshoot (one per usage row) for the caller to record and act on
    (pause_overshot), never hidden by capping the number.
    """
    overshoots: list[Overshoot] = []
    with connection.cursor() as cursor:
        for usage_id, reserved in _in_lock_order(reservations):
            cursor.execute(sql.SETTLE_RESERVATION, [reserved, actual_minor, usage_id])
            row = cursor.fetchone()
            if row is not None and actual_minor > reserved:
                overshoots.append(
                    Overshoot(usage_id=usage_id, budget_id=int(row[0]), reserved_minor=reserved, actual_minor=actual_minor)
                )
    return overshoots


def pause_overshot(*, overshoots: Sequence[Overshoot], operation: str) -> list[Pause]:
    """Drain-pause the scope of every spend-capped budget a call overshot, naming the overshoot.

    A cost above its reservation means the bound the reservation trusted was broken (the
    provider billed more than a call can cost), so the cap no longer holds for this scope:
    nothing new is claimed there until a person has looked and resumed. Call it in the
    settlement's transaction, so the spend, the operation's record and the pause commit
    together. A scope that is already paused stays under its existing pause.
    """
    rows = Budget.objects.in_bulk({o.budget_id for o in overshoots})
    made: list[Pause] = []
    for over in overshoots:
        budget = rows.get(over.budget_id)
        if budget is None or budget.spend_limit_minor is None:
            continue  # no cap to protect
        reason = (
            f"budget {budget.name!r}: overshoot of {over.minor} minor units by {operation}: billed {over.actual_minor}, "
            f"reserved {over.reserved_minor} (its upper bound); spend may pass the cap of {budget.spend_limit_minor} "
            f"{budget.currency}. Check the provider's billing, then resume"
        )
        paused = pause_scope(budget=budget, reason=reason)
        if paused is not None:
            made.append(paused)
    return made


def pause_scope(*, budget: Budget, reason: str) -> Pause | None:
    """Drain-pause the scope ``budget`` covers, as the budget (an exhausted cap, an overshoot):
    for the budget's tenant only when it has one, so one tenant's exhausted or overshot budget
    holds that tenant's work and nobody else's.

    None when that scope is already paused for that tenant: pause_one_live_per_scope decides,
    inside pause()'s own savepoint, and the existing pause stands.
    """
    try:
        return pauses.pause(
            scope=budget.scope,
            target=budget.target,
            tenant=budget.tenant,
            mode=PauseMode.DRAIN,
            source=PauseSource.BUDGET,
            actor="budget",
            reason=reason,
        )
    except SafetyError:
        return None


def release(*, reservations: Sequence[Sequence[int]], refund_request: bool = False) -> None:
    """Give reservations back: the call did not happen."""
    with connection.cursor() as cursor:
        for usage_id, reserved in _in_lock_order(reservations):
            cursor.execute(sql.RELEASE_RESERVATION, [reserved, 1 if refund_request else 0, usage_id])


def claims_are_gated() -> bool:
    """Whether any budget limits what claims must check (concurrency, attempts, run time)."""
    return Budget.objects.filter(
        Q(concurrency_limit__isnull=False) | Q(attempt_limit__isnull=False) | Q(run_seconds_limit__isnull=False)
    ).exists()


def admit_claim(*, job_id: int, kind: str, queue: str, tenant: str) -> None:
    """Run inside the claim's transaction, after the job row was claimed.

    Raises ClaimBlocked (concurrency full: roll back, leave the job queued) or
    BudgetExhausted (attempts or run time spent: roll back, park the job). The attempt's run time
    is added to the same budgets' usage rows when it ends (sql._FINISH).
    """
    params = _params(kind, queue, tenant)
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_BUDGETS, params)
        budgets = cursor.fetchall()
        if not budgets:
            return
        limited = [row for row in budgets if row[5] is not None]
        if limited:
            # Claims in one concurrency scope take turns on the budget row, so each counts the
            # running jobs with every earlier claim already committed: no two can both see room.
            cursor.execute(sql.LOCK_BUDGETS, [[row[0] for row in limited]])
            for _budget_id, name, scope, target, budget_tenant, limit, _ in limited:
                cursor.execute(
                    sql.COUNT_RUNNING_IN_SCOPE[(scope, bool(budget_tenant))], {"target": target, "tenant": budget_tenant}
                )
                (running,) = cursor.fetchone()
                if running > limit:  # the count includes the job this claim just took
                    raise ClaimBlocked(scope=scope, target=target, name=name)
        counted = [row[0] for row in budgets if row[6]]
        if not counted:
            return
        applicable = _ensure_usage(cursor, sql.ENSURE_USAGE_BY_ID, {"ids": counted})
        cursor.execute(sql.COUNT_CLAIM_ATTEMPT, {"ids": counted})
        granted = {budget_id for _usage_id, budget_id in cursor.fetchall()}
        for budget_id, name, period in applicable:
            if budget_id not in granted:
                raise _exhausted(budget_id=budget_id, name=name, period=period, need=0, limits=("attempts", "run_seconds"))


def _has_room(budget: Budget | None, parked_on: dict[str, Any]) -> bool:
    if budget is None:
        return True  # the budget was deleted: nothing holds the job any more
    period = period_for(budget)
    if parked_on.get("period") != period.isoformat():
        return True  # a new period began
    usage = usage_for(budget=budget, on=period)
    return _room(budget, usage, str(parked_on.get("limit")), int(parked_on.get("need") or 0))


def unpark_ready(*, batch: int = 1000) -> int:
    """Requeue budget-parked jobs whose budget has room again (new period or raised limit)."""
    parked = list(
        Job.objects.filter(state=JobState.PARKED, park_reason=ParkReason.BUDGET)
        .order_by("parked_at")
        .values_list("id", "parked_on")[:batch]
    )
    if not parked:
        return 0
    budgets = Budget.objects.in_bulk({int(p[1].get("budget_id") or 0) for p in parked})
    verdict: dict[tuple[Any, ...], bool] = {}
    ready: list[int] = []
    for job_id, parked_on in parked:
        key = (parked_on.get("budget_id"), parked_on.get("limit"), parked_on.get("need"), parked_on.get("period"))
        if key not in verdict:
            verdict[key] = _has_room(budgets.get(int(parked_on.get("budget_id") or 0)), parked_on)
        if verdict[key]:
            ready.append(job_id)
    with transaction.atomic():
        return len(unpark_jobs(job_ids=ready, reason=ParkReason.BUDGET))
