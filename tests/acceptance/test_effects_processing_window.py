"""A charge the provider is still processing (issue 9, scenario 2), with real worker subprocesses:
one killed with kill -9 or timed out mid-charge, another picking the job up
(tests/integration/test_effects_processing_window.py has the in-process cases and the helpers shared with them)."""

from __future__ import annotations

import time

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.conftest import wait_for
from tests.integration.test_effects_processing_window import shop, spend_budget
from tests.support.effects import effects_env
from tests.support.fleet import assert_engine_invariants, attempts, wait_workers_ready
from workers.models import Job, Operation
from workers.services import budgets

# transaction=True: real worker subprocesses, and bodies run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


OPEN = ("in_flight", "uncertain")
# The provider commits the charge this long after accepting it: longer than lease (3 s) + grace
# (0.5 s) + the five 1-second retries with which today's code gave up.
PROCESSING_SECONDS = 12.0
# What the payment client declares as the provider's processing window (must cover the above).
WINDOW_SECONDS = "20"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill_9", "client_timeout"])
def test_a_charge_the_provider_is_still_processing_is_never_recorded_as_absent(
    processes, provider: FakeProvider, how: str
) -> None:
    budget = spend_budget()
    provider.fault("processing", resource="charges", seconds=PROCESSING_SECONDS, times=1)
    env = effects_env(
        provider,
        # kill_9: the worker waits for the answer and dies; client_timeout: it gives up after 1 s.
        KOALA_PAYMENTS_TIMEOUT_SECONDS="120" if how == "kill_9" else "1",
        KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS=WINDOW_SECONDS,
    )
    first = processes.worker("--name", "proc-a", env=env)
    processes.beat(env=env)
    wait_workers_ready([first])

    job_id = shop(f"o-proc-{how}")
    wait_for(lambda: provider.accepted("charges"), timeout=20, what="the provider to accept the charge")
    accepted_at = time.monotonic()
    if how == "kill_9":
        first.kill()
        first.wait(timeout=10)
        processes.worker("--name", "proc-b", env=env)

    # Sample Koala's record of the charge until the job settles: at no moment may it say "did not
    # happen" (failed / absent), and while it is open its reservation is held.
    seen: list[tuple[float, str, str, bool, bool]] = []

    def settled() -> bool:
        job = Job.objects.get(pk=job_id)
        op = Operation.objects.filter(key=f"shop-o-proc-{how}:charge").first()
        if op is not None:
            charged = bool(provider.effects("charges"))
            seen.append((time.monotonic() - accepted_at, op.state, op.resolution, bool(op.reservations), charged))
        return job.state in ("succeeded", "failed", "cancelled", "parked")

    wait_for(settled, timeout=90, interval=0.1, what="the job to settle")
    job = Job.objects.get(pk=job_id)
    # The provider commits the charge whatever Koala concluded (today: after the job had failed).
    [charge] = wait_for(lambda: provider.effects("charges"), timeout=30, what="the charge to commit")  # type: ignore[misc]
    states = {s[1] for s in seen}
    outcome = f"job {job.state}/{job.failure_reason}, op states {sorted(states)}, last samples {seen[-3:]}"
    assert "failed" not in states and "absent" not in {s[2] for s in seen}, f"recorded as not happened: {outcome}"
    assert all(held for (_, state, _, held, _) in seen if state in OPEN), "the reservation was released while open"
    assert (job.state, job.failure_reason) == ("succeeded", None), (job.state, job.failure_reason, job.error_message)

    op = Operation.objects.get(key=f"shop-o-proc-{how}:charge")
    assert (op.state, op.resolution, op.external_id, op.attempts) == ("reconciled", "found", charge["id"], 1)
    assert job.result["charge"] == charge["id"]
    # Sent once; never re-sent under the key while the provider was processing it.
    assert [r["outcome"] for r in provider.requests("charges")] == ["accepted"]
    lookups = [e["status"] for e in provider.lookups("charges")]
    assert 404 in lookups and lookups[-1] == 200, lookups  # misses inside the window proved nothing
    # Waiting for the provider used no attempts: the send's attempt and the one that found it.
    assert job.attempts <= 2, [(a.outcome, a.error_message) for a in attempts(job_id)]
    assert seen[-1][0] >= PROCESSING_SECONDS - 1, "settled only once the provider had committed"
    usage = budgets.usage_for(budget=budget)
    assert (usage.spent_minor, usage.reserved_minor) == (1200, 0)
    assert len(provider.effects("orders")) == 1
    assert_engine_invariants()
