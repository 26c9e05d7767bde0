"""Side effects across real worker crashes and real concurrency: worker subprocesses (kill -9),
the beat (reaper), the loopback provider and the SMTP sink, on real PostgreSQL and Redis.

Timings come from tests.conftest.worker_env: lease 3 s, heartbeat 0.5 s, grace 0.5 s, beat 0.2 s.
Effects are counted in the provider's and the sink's own records, never in Koala's tables.
"""

from __future__ import annotations

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.conftest import wait_for
from tests.fakes.smtp import SmtpSink
from tests.support.effects import effects_env
from tests.support.fleet import assert_engine_invariants, attempts, wait_state, wait_workers_ready
from workers.models import Job, Operation
from workers.services import budgets, operations
from workers.services.jobs import JobSpec, enqueue, enqueue_many

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def operation(job_id: int, name: str) -> Operation:
    return Operation.objects.get(job_id=job_id, name=name)


# Issue 3, test 1.
def test_kill_9_after_the_charge_reached_the_provider_reconciles_to_one_charge(processes, provider: FakeProvider) -> None:
    # The provider commits the charge, then holds its answer; the worker waits for it (long
    # client timeout) and is killed meanwhile: the charge happened, Koala never heard back.
    provider.fault("commit_then_timeout", resource="charges", seconds=60, times=1)
    env = effects_env(provider, KOALA_PAYMENTS_TIMEOUT_SECONDS="120")
    first = processes.worker("--name", "charge-a", env=env)
    processes.beat(env=env)
    wait_workers_ready([first])

    job_id = enqueue(kind="shop.order_and_charge", input={"reference": "o-kill", "amount_minor": 1200, "currency": "EUR"}).job_id
    wait_for(lambda: provider.effects("charges"), timeout=20, what="the charge to reach the provider")
    assert operation(job_id, "charge").state == "in_flight"  # recorded before the call; the answer never came
    first.kill()
    first.wait(timeout=10)

    processes.worker("--name", "charge-b", env=env)
    job = wait_state(job_id, "succeeded", timeout=40)
    [charge] = provider.effects("charges")
    op = operation(job_id, "charge")
    assert (op.state, op.resolution, op.external_id) == ("reconciled", "found", charge["id"])
    assert job.result["charge"] == charge["id"]
    assert len(provider.requests("charges")) == 1, "the replacement attempt looked the charge up instead of sending it"
    assert [e["status"] for e in provider.lookups("charges")] == [200]
    assert [a.outcome for a in attempts(job_id)] == ["orphaned", "succeeded"]
    assert attempts(job_id)[0].worker_id != attempts(job_id)[1].worker_id
    assert len(provider.effects("orders")) == 1
    assert_engine_invariants()


def test_kill_9_after_smtp_accepted_the_email_asks_a_person_and_never_sends_twice(processes, smtp_sink: SmtpSink) -> None:
    # SMTP cannot be asked "did you get message X?": after this crash the outcome is unknown to
    # Koala, so the job waits for a person instead of risking a second email.
    smtp_sink.hold(60)
    env = effects_env(smtp=smtp_sink, EMAIL_TIMEOUT="120")
    first = processes.worker("--name", "mail-a", env=env)
    processes.beat(env=env)
    wait_workers_ready([first])

    data = {"to": "ana@example.com", "subject": "Receipt", "template": "receipt", "context": {"order": "o-7"}}
    job_id = enqueue(kind="email.send", input=data, idempotency_key="receipt-o-7").job_id
    wait_for(smtp_sink.messages, timeout=20, what="the message to reach the SMTP server")
    first.kill()
    first.wait(timeout=10)

    processes.worker("--name", "mail-b", env=env)
    job = wait_state(job_id, "parked", timeout=40)
    assert job.park_reason == "needs_attention"
    op = operation(job_id, "send")
    assert op.state == "uncertain"
    assert list(operations.needing_attention()) == [op]
    [message] = smtp_sink.messages()

    # The person checks the mailbox (here: the sink's record) and says it was delivered.
    smtp_sink.hold(0)
    operations.resolve_operation(
        operation_id=op.pk, happened=True, external_id=message["message_id"], note="in the recipient's mailbox", actor="ops-bo"
    )
    job = wait_state(job_id, "succeeded", timeout=30)
    assert job.result == {"message_id": message["message_id"], "recipients": 1}
    assert len(smtp_sink.messages()) == 1
    assert message["idempotency_key"] == op.key
    assert_engine_invariants()


# Issue 3, test 5.
def test_a_concurrency_limit_of_2_holds_at_the_provider_with_10_jobs_and_4_workers(processes, provider: FakeProvider) -> None:
    budgets.create_budget(name="models-two-at-a-time", scope="kind", target="model.complete", concurrency_limit=2, actor="test")
    provider.fault("slow", resource="completions", seconds=0.6)
    env = effects_env(provider, KOALA_DOORBELL_DEPTH="10")
    workers = [processes.worker("--name", f"conc-{n}", env=env) for n in range(4)]
    processes.beat(env=env)
    wait_workers_ready(workers)

    results = enqueue_many(
        specs=[
            JobSpec(kind="model.complete", input={"model": "m-small", "prompt": f"question {n}", "max_tokens": 8})
            for n in range(10)
        ]
    )
    ids = [r.job_id for r in results]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == 10, timeout=90, interval=0.2, what="10 model calls"
    )
    stats = provider.stats()
    # Never more than 2 at the provider, and the 4 workers did push it to the limit.
    assert stats["max_in_flight"]["completions"] == 2, stats
    assert len(provider.effects("completions")) == 10 and len(provider.requests("completions")) == 10
    assert len({a.worker_id for job_id in ids for a in attempts(job_id)}) >= 2, "several worker processes took part"
    assert_engine_invariants()
