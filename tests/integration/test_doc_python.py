"""Every Python block of the documents runs as written, and does what its document says.

Each document's blocks run in order in one session (tests/support/doc_python.py: Django set up, the
test database), then the test does what the document goes on to say (enqueue the kind a block
declared, drain it in this process through tests/inprocess.py) and checks the outcome the
document describes. docs/safety.md's reconcile example runs against the sandbox payment provider
(devtools/sandbox/provider.py, with Koala's real payment client) once for each way its lookup
can answer: found; Miss inside the provider's processing window (wait); Miss past it (proven
absent: sent again under the same key); None, "cannot tell" (a person decides).

The sdk/python/README.md worker runs against a live server in tests/acceptance/test_example_workers.py;
here its block is the session code it is (it defines its bodies, serves nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command

from devtools.sandbox.provider import FakeProvider
from effects.providers import payments
from exports.models import Account, Export, ExportState
from reviews.models import ReviewRequest
from tests.inprocess import run_export, run_until
from tests.support.doc_python import Session, declared_kinds, python_documents, relative, runnable_python_blocks, session
from traces.selectors import spans_of_job
from workers.models import Budget, Job, JobState, Operation, OperationState, Resolution
from workers.services import operations

# transaction=True: the documents' jobs run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
# Each document with Python blocks, and the tests below that run them.
RUN_HERE = {
    "README.md",
    "docs/engine.md",
    "docs/exports.md",
    "docs/redaction.md",
    "docs/safety.md",
    "docs/workflows.md",
    "sdk/python/README.md",
}


@pytest.fixture
def run_doc(tmp_path: Path) -> Iterator[Callable[[str], Session]]:
    """``run_doc("docs/x.md")``: the document's blocks run; its session (dropped after the test)."""
    with ExitStack() as stack:

        def run(document: str) -> Session:
            return stack.enter_context(session(REPO / document, tmp_path / "reader")).run_all()

        yield run


def ran_every_declared_kind(run: Session) -> None:
    """A kind a document declares is not just registered: a job of it ran (ended or parked)."""
    for handle in declared_kinds(run):
        ran = Job.objects.filter(kind=handle.name, version=handle.version).exclude(state__in=[JobState.QUEUED, JobState.RUNNING])
        assert ran.exists(), f"{relative(run.path)} declares {handle.key}, and no job of it ran here"


def test_every_document_with_python_blocks_is_run_here() -> None:
    with_blocks = {relative(path) for path in python_documents() if runnable_python_blocks(path)}
    assert with_blocks == RUN_HERE, "a document's Python blocks need a test here that runs them and checks what it says"


# -- README.md -----------------------------------------------------------------------------------


def test_readme_first_kind_writes_its_card_once(
    run_doc: Callable[[str], Session], tmp_path: Path, monkeypatch, redis_clean: None
) -> None:
    monkeypatch.setenv("KOALA_DATA_DIR", str(tmp_path / "data"))
    run = run_doc("README.md")
    greet = run["greet"]
    created = greet.enqueue({"name": "Ana"}, key="hello-ana")
    assert greet.enqueue({"name": "Ana"}, key="hello-ana").job_id == created.job_id  # "the same --key returns the same job"
    job = run_until(created.job_id, JobState.SUCCEEDED)
    card = tmp_path / "data" / "hello-cards" / "hello-ana:card.txt"
    assert card.read_text() == "Hello, Ana!\n"
    assert job.result == {"card": str(card)} and job.attempts == 1
    assert Operation.objects.get(job_id=created.job_id).state == OperationState.SUCCEEDED
    ran_every_declared_kind(run)


# -- docs/engine.md ------------------------------------------------------------------------------


def test_engine_report_kind_sends_and_a_missing_report_fails_for_good(
    run_doc: Callable[[str], Session], redis_clean: None
) -> None:
    run = run_doc("docs/engine.md")  # its second block enqueues twice and asserts the same job
    job = run_until(run["created"].job_id, JobState.SUCCEEDED)
    assert (job.result, job.run_state, job.attempts) == ({"sent": True}, {"sent_chunks": 3}, 1)
    assert job.usage.get("requests") == 3
    # "a span of the job's trace": one per chunk, under the attempt's span.
    [attempt] = spans_of_job(job_id=job.pk)
    assert [(child.name, child.attributes["index"]) for child in attempt.children] == [
        ("report.chunk", 0),
        ("report.chunk", 1),
        ("report.chunk", 2),
    ]
    missing = run["send_report"].enqueue({"report_id": "r-404", "recipient": "ana@example.com"})
    failed = run_until(missing.job_id, JobState.FAILED)
    assert (failed.failure_reason, failed.error_class, failed.attempts) == ("terminal", "TerminalFailure:unknown_report", 1)
    assert "ana@example.com" not in (Job.objects.get(pk=missing.job_id).error_message or "")
    ran_every_declared_kind(run)


# -- docs/exports.md -----------------------------------------------------------------------------


def test_exports_request_settings_module_and_budget(
    run_doc: Callable[[str], Session], export_root: Path, capsys, redis_clean: None
) -> None:
    # The demo's alice, a member of acme (what the document's first block looks up).
    acme = Account.objects.create(slug="acme", name="Acme")
    acme.members.add(User.objects.create_user("alice"))
    run = run_doc("docs/exports.md")

    assert capsys.readouterr().out.strip() == "queued"
    export: Export = run["export"]
    assert (export.max_rows, export.time_limit_seconds) == (1_000_000, 600)
    assert export.max_bytes == settings.KOALA_EXPORT_MAX_BYTES  # "omitted limits default to the caps"
    done = run_export(export.pk)
    assert done.state == ExportState.SUCCEEDED, (done.failure_code, done.error_message)

    # The settings module of your own: Koala's settings, with the exports alias on S3.
    [own] = run.modules.values()
    assert own.STORAGES["exports"]["BACKEND"] == "storages.backends.s3.S3Storage"
    assert own.STORAGES["exports"]["OPTIONS"]["file_overwrite"] is False
    assert own.STORAGES["default"] == settings.STORAGES["default"] and own.INSTALLED_APPS == settings.INSTALLED_APPS
    assert settings.STORAGES["exports"]["BACKEND"] != own.STORAGES["exports"]["BACKEND"], "it changed this process's settings"

    budget = Budget.objects.get(name="exports")
    assert (budget.scope, budget.target, budget.concurrency_limit) == ("queue", "exports", 1)


# -- docs/redaction.md ---------------------------------------------------------------------------


def test_redaction_sensitive_fields_are_masked_in_what_koala_prints(run_doc: Callable[[str], Session], redis_clean: None) -> None:
    run = run_doc("docs/redaction.md")
    token, dossier = "tok_live_9f8e7d6c5b4a39281706", "Patient record 4471: diagnosis and treatment plan for the claim"
    created = run["summarise"].enqueue({"api_token": token, "dossier": dossier, "case": 4471})
    run_until(created.job_id, JobState.SUCCEEDED)
    out = StringIO()
    call_command("koala_job", str(created.job_id), "--json", stdout=out)
    printed = out.getvalue()
    assert "4471" in printed, printed  # the job is shown
    assert token not in printed and "diagnosis and treatment" not in printed, printed
    ran_every_declared_kind(run)


# -- docs/safety.md ------------------------------------------------------------------------------


def order(reference: str, amount: int = 1200) -> str:
    """An order at the provider, for the example kind to charge."""
    made = payments.client().create_order(key=f"order-{reference}", reference=reference, amount_minor=amount, currency="EUR")
    return str(made["id"])


def charge_job(run: Session, reference: str, amount: int = 1200) -> int:
    data = {"order": order(reference, amount), "amount_minor": amount, "currency": "EUR"}
    return int(run["charge"].enqueue(data, key=f"charge-{reference}").job_id)


@pytest.fixture
def safety(run_doc: Callable[[str], Session], provider: FakeProvider, settings: Any, redis_clean: None) -> Session:
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5  # a held answer is a read timeout soon
    return run_doc("docs/safety.md")


def test_safety_reconcile_found_settles_the_charge_without_sending_again(safety: Session, provider: FakeProvider) -> None:
    # The provider commits the charge and holds its answer past the client's timeout: outcome unknown.
    provider.fault("commit_then_timeout", resource="charges", seconds=2, times=1)
    job_id = charge_job(safety, "found")
    job = run_until(job_id, JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED)
    assert job.state == JobState.SUCCEEDED, (job.state, job.error_message, job.park_detail)
    [charge] = provider.effects("charges")
    assert job.result == {"charge": charge["id"]}
    op = Operation.objects.get(key="charge-found:charge")
    assert (op.state, op.resolution) == (OperationState.RECONCILED, Resolution.FOUND)
    assert len(provider.requests("charges")) == 1 and [e["status"] for e in provider.lookups("charges")] == [200]


def test_safety_reconcile_miss_inside_the_window_waits_for_the_provider(
    safety: Session, provider: FakeProvider, settings: Any
) -> None:
    # The provider accepts the charge and commits it 2 s later; until then a lookup misses (404).
    # Inside its declared processing window that is no proof: the ledger waits, sends nothing.
    settings.KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS = 30.0
    provider.fault("processing", resource="charges", seconds=2, lookup="miss", times=1)
    job_id = charge_job(safety, "late")
    job = run_until(job_id, JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED, timeout=30)
    assert job.state == JobState.SUCCEEDED, (job.state, job.error_message, job.park_detail)
    op = Operation.objects.get(key="charge-late:charge")
    assert (op.state, op.resolution) == (OperationState.RECONCILED, Resolution.FOUND)
    assert len(provider.requests("charges")) == 1, "sent again while the provider was still processing it"
    assert len(provider.effects("charges")) == 1
    looked = [e["status"] for e in provider.lookups("charges")]
    assert looked[0] == 404 and looked[-1] == 200, looked
    assert job.attempts == 2, "waiting for the provider used no attempt"


def test_safety_reconcile_miss_past_the_window_sends_again_under_the_same_key(safety: Session, provider: FakeProvider) -> None:
    # The provider fails before doing anything (503: outcome unknown to the client); its lookup then
    # misses, and with its processing window (0 s for the sandbox) over, that is proof: send again.
    provider.fault("5xx", resource="charges", status=503, times=1)
    job_id = charge_job(safety, "lost")
    job = run_until(job_id, JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED)
    assert job.state == JobState.SUCCEEDED, (job.state, job.error_message, job.park_detail)
    [charge] = provider.effects("charges")
    assert charge["id"] == job.result["charge"]
    assert [e["status"] for e in provider.lookups("charges")] == [404]
    assert {r["key"] for r in provider.requests("charges")} == {"charge-lost:charge"}, "re-sent under the same key"
    assert Operation.objects.get(key="charge-lost:charge").state == OperationState.SUCCEEDED


def test_safety_reconcile_cannot_tell_goes_to_a_person_and_nothing_is_sent_again(safety: Session, provider: FakeProvider) -> None:
    # The charge commits, its answer is lost, and the provider cannot look keys up (501): None.
    provider.fault("lookup_disabled", resource="charges")
    provider.fault("commit_then_timeout", resource="charges", seconds=2, times=1)
    job_id = charge_job(safety, "unknown")
    job = run_until(job_id, JobState.PARKED, JobState.SUCCEEDED, JobState.FAILED)
    assert (job.state, job.park_reason) == (JobState.PARKED, "needs_attention"), (job.state, job.error_message)
    op = Operation.objects.get(key="charge-unknown:charge")
    assert op.state == OperationState.UNCERTAIN
    assert [e["status"] for e in provider.lookups("charges")] == [501]
    assert len(provider.requests("charges")) == 1, "sent again although nobody could tell"
    # The person finds it at the provider and says so; the re-run returns it, sending nothing.
    [charge] = provider.effects("charges")
    operations.resolve_operation(
        operation_id=op.pk, happened=True, external_id=charge["id"], note="in the dashboard", actor="ops"
    )
    job = run_until(job_id, JobState.SUCCEEDED)
    assert len(provider.requests("charges")) == 1 and len(provider.effects("charges")) == 1


def test_safety_a_charge_above_the_line_waits_for_review_unsent(safety: Session, provider: FakeProvider) -> None:
    job_id = charge_job(safety, "big", amount=7500)
    job = run_until(job_id, JobState.PARKED)
    assert job.park_reason == "waiting_review" and job.attempts == 0
    assert ReviewRequest.objects.get(job_id=job_id).state == "pending"
    assert provider.requests("charges") == []


def test_safety_critical_rules_are_the_kinds_own(safety: Session) -> None:
    fulfil = safety["fulfil"].kind
    assert fulfil.is_critical("charge", {}, 5001) and not fulfil.is_critical("charge", {}, 5000)
    assert fulfil.is_critical("notify", {}, None)
    assert fulfil.is_critical("write", {"env": "production"}, None) and not fulfil.is_critical("write", {"env": "staging"}, None)
    assert not fulfil.is_critical("lookup", {}, 10**9)
    job = run_until(safety["fulfil"].enqueue({}).job_id, JobState.SUCCEEDED)
    assert job.result is None


# -- sdk/python/README.md ------------------------------------------------------------------------


def test_sdk_readme_worker_is_the_example_file(run_doc: Callable[[str], Session]) -> None:
    run = run_doc("sdk/python/README.md")
    [block] = runnable_python_blocks(REPO / "sdk/python/README.md")
    assert "\n".join(block.lines) + "\n" == (REPO / "examples/python-worker/worker.py").read_text()
    assert callable(run["main"]) and callable(run["send_invoice"])  # served by tests/acceptance/test_example_workers.py


# -- docs/workflows.md ---------------------------------------------------------------------------


def test_workflows_support_ticket_classifies_drafts_waits_for_the_reviewer_and_emails_once(
    run_doc: Callable[[str], Session], provider: FakeProvider, mailoutbox: list[Any], redis_clean: None
) -> None:
    from flows.models import Run, RunStep, Signal
    from tests.inprocess import drain_until

    run = run_doc("docs/workflows.md")
    started = run["run"]
    assert run["answer"].outcome == "buffered"  # sent before the run reached its wait
    done = drain_until(
        lambda: (r := Run.objects.get(pk=started.pk)).state in ("succeeded", "failed", "cancelled") and r, what="the ticket's run"
    )
    assert done.state == "succeeded", done.error
    steps = {row.name: row for row in RunStep.objects.filter(run=done)}
    assert {name: row.state for name, row in steps.items()} == dict.fromkeys(("classify", "draft", "review", "send"), "succeeded")
    assert steps["review"].output == {"reviewer": "bob"} and Signal.objects.get(run=done).status == "consumed"
    assert steps["send"].output["approved_by"] == "bob"
    assert done.run_state["replied"] is True and done.run_state["label"].startswith("[m-small]")
    # The model was asked twice (classify, draft), the email went out once, each under its run's key.
    assert len(provider.requests("completions")) == 2
    [message] = mailoutbox
    assert message.to == ["ana@example.com"] and message.subject == "Re: ticket T-1042"
    assert message.body.strip() == steps["draft"].output["draft"]
    email_op = Operation.objects.get(job_id=steps["send"].job_id)
    assert (email_op.kind, email_op.state, email_op.key) == ("email", "succeeded", f"koala-run-{done.pk}-send:email")
    # "the same key makes a retried start the same run"
    again = run["services"].start_run(definition="support_ticket", input=done.input, idempotency_key="ticket-T-1042", actor="x")
    assert not again.created and again.run.pk == done.pk
    # The first block's definition runs too: its wait resumed by a signal, and the last step sees it.
    hello = run["services"].start_run(definition="hello_flow", input={"name": "Ana"}, actor="doc")
    drain_until(lambda: RunStep.objects.filter(run=hello.run, name="ack", state="waiting").exists(), what="hello's wait")
    run["services"].send_signal(run_id=hello.run.pk, name="hello.ack", key="a1", payload={"ok": True}, actor="doc")
    finished = drain_until(lambda: (r := Run.objects.get(pk=hello.run.pk)).state == "succeeded" and r, what="hello's run")
    assert RunStep.objects.get(run=finished, name="log").output == {"greeting": "Hello, Ana!", "ack": {"ok": True}}
    ran_every_declared_kind(run)
