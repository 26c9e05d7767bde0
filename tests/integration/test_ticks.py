"""koala_tick's lease in one process: taken by one conditional upsert, refused while held,
taken over once expired (the previous run flagged as crashed), fenced, released at exit."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from django.db import connection

from workers import hooks
from workers.models import Budget, BudgetUsage, Job, TickLease
from workers.services import ticks
from workers.services.budgets import create_budget, period_for

# transaction=True: the lease statements compare with PostgreSQL's now(), which stands still in a transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def expire(name: str) -> None:
    TickLease.objects.filter(name=name).update(expires_at=TickLease.objects.get(name=name).acquired_at)


def test_a_held_lease_refuses_a_second_run_and_an_expired_one_is_taken_over() -> None:
    lease, previous = ticks.acquire(name="prune", seconds=60, owner="host-a:1")
    assert previous == ticks.Previous()  # never ran
    with pytest.raises(ticks.PreviousRunActive, match=r"still running \(host-a:1") as refused:
        ticks.acquire(name="prune", seconds=60, owner="host-b:2")
    assert refused.value.expires_at is not None
    row = TickLease.objects.get(name="prune")
    assert (row.owner, row.token) == ("host-a:1", lease.token), "the refused run changed nothing"

    expire("prune")  # host-a died: its lease ran out unreleased
    taken, previous = ticks.acquire(name="prune", seconds=60, owner="host-b:2")
    assert (previous.owner, previous.crashed) == ("host-a:1", True)
    # The fence: the old holder's next check stops it; its release changes nothing.
    with pytest.raises(ticks.TickLeaseLost):
        lease.hold()
    lease.release(outcome="ok")
    assert TickLease.objects.get(name="prune").token == taken.token
    taken.hold()  # the new holder's check passes and renews
    taken.release(outcome="ok")
    row = TickLease.objects.get(name="prune")
    assert (row.expires_at, row.last_outcome) == (None, "ok") and row.released_at is not None
    # Released: the next run proceeds at once, and knows the previous one ended cleanly.
    again, previous = ticks.acquire(name="prune", seconds=60, owner="host-c:3")
    assert (previous.owner, previous.crashed, previous.outcome) == ("host-b:2", False, "ok")
    again.release(outcome="ok")


def test_a_run_releases_its_lease_with_the_outcome_even_when_the_task_raises() -> None:
    def broken(lease: hooks.TickLease) -> None:
        lease.hold()
        raise RuntimeError("boom")

    hooks.register_tick_task("broken-test", broken, help="raises")
    try:
        with pytest.raises(RuntimeError, match="boom"):
            ticks.run(name="broken-test")
    finally:
        hooks.unregister_tick_task("broken-test")
    row = TickLease.objects.get(name="broken-test")
    assert (row.expires_at, row.last_outcome) == (None, "failed: RuntimeError")


def test_a_run_that_lost_its_lease_mid_work_stops_and_says_so() -> None:
    def stalls(lease: hooks.TickLease) -> None:
        expire(lease.name)  # as if this run stalled past its lease …
        ticks.acquire(name=lease.name, seconds=60, owner="other:9")  # … and another run took over
        lease.hold()  # the next bounded step's check
        raise AssertionError("never reached")

    hooks.register_tick_task("stalls-test", stalls, help="stalls")
    try:
        with pytest.raises(ticks.TickLeaseLost):
            ticks.run(name="stalls-test")
    finally:
        hooks.unregister_tick_task("stalls-test")
    assert TickLease.objects.get(name="stalls-test").owner == "other:9", "the stalled run released nothing of the new one's"


def test_unknown_task_is_refused_before_any_row_changes() -> None:
    with pytest.raises(ticks.UnknownTickTask, match="budget-report"):  # the message lists the tasks
        ticks.run(name="nope")
    assert not TickLease.objects.exists()


def test_the_shipped_tasks_are_registered_and_run() -> None:
    assert {"prune", "budget-report", "export-cleanup"} <= set(hooks.tick_tasks())
    finished = Job.objects.count()
    assert ticks.run(name="prune").result["jobs"] == 0 and Job.objects.count() == finished
    budget = create_budget(name="daily-llm", scope="global", target="", actor="ops", spend_limit_minor=1000)
    yesterday: date = period_for(budget) - timedelta(days=1)
    BudgetUsage.objects.create(budget=budget, period=yesterday, spent_minor=420, requests=7)
    done = ticks.run(name="budget-report")
    assert done.result == {"budgets": Budget.objects.count()}
    from workers.selectors.budgets import daily_report

    [line] = [line for line in daily_report() if line.startswith("daily-llm")]
    assert f"daily-llm {yesterday}" in line and "spent 420" in line and "requests 7" in line
    assert ticks.run(name="export-cleanup").result == {"settled": 0, "temp_objects_removed": 0}
    assert set(TickLease.objects.values_list("name", "last_outcome")) >= {
        ("prune", "ok"),
        ("budget-report", "ok"),
        ("export-cleanup", "ok"),
    }
    with connection.cursor() as cursor:  # every lease released
        cursor.execute("SELECT count(*) FROM workers_ticklease WHERE expires_at IS NOT NULL")
        assert cursor.fetchone() == (0,)
