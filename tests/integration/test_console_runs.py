"""The console's workflow pages through Django's test client: the runs list and the journal
(audited reads, redacted values, spans nested under each attempt), the start, signal, cancel and
move forms (roles enforced, audit rows written, bad input a clear error that changes nothing),
and the read-only admin pages of runs, steps and signals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from flows import services
from flows.models import Run, RunStep, Signal
from koala.models import AuditEvent
from tests.inprocess import drain_until
from workers.models import Job, WorkerProcess

SECRET = "sk_live_journal9d8f7e6a5b4c3d2e1f"  # under api_key (always sensitive), and credential-shaped


def _rows() -> tuple[int, int, int, int]:
    """What a refused form must leave alone: runs, steps, signals, and audit rows that are not reads."""
    return (
        Run.objects.count(),
        RunStep.objects.count(),
        Signal.objects.count(),
        AuditEvent.objects.exclude(action="read").count(),
    )


def _finished(run_id: int) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.state in ("succeeded", "failed", "cancelled") else None


def _state(run_id: int, *states: str) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.state in states else None


def _start_form(**fields: Any) -> dict[str, Any]:
    return {"definition": "ticket", "version": "1", "input": "{}", "idempotency_key": "", **fields}


@pytest.mark.django_db
def test_each_role_gets_what_its_permissions_say_and_a_refused_post_changes_nothing(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    run = services.start_run(definition="ticket", version=1, input={"log": str(tmp_path / "e")}, actor="setup").run
    before = _rows()
    for role in ("operator", "reviewer", "auditor"):
        assert clients[role].get("/admin/console/runs/").status_code == 200, role
        assert clients[role].get(f"/admin/console/runs/{run.pk}/").status_code == 200, role
        assert clients[role].get("/admin/console/runs/stranded/").status_code == 200, role
    assert clients["norole"].get("/admin/console/runs/").status_code == 403
    assert clients["norole"].get(f"/admin/console/runs/{run.pk}/").status_code == 403
    assert clients["anonymous"].get(f"/admin/console/runs/{run.pk}/").status_code == 302  # to the login
    start = _start_form(input=json.dumps({"log": str(tmp_path / "x")}))
    for role in ("reviewer", "auditor", "norole", "anonymous"):
        expected = 302 if role == "anonymous" else 403
        assert clients[role].post("/admin/console/runs/start/", start).status_code == expected, role
        assert clients[role].post(f"/admin/console/runs/{run.pk}/cancel/", {"confirm": "on"}).status_code == expected, role
        assert clients[role].post(f"/admin/console/runs/{run.pk}/move/", {"to_version": "1", "confirm": "on"}).status_code == (
            expected
        ), role
    for role in ("auditor", "norole"):
        signal = {"name": "reviewer.approved", "key": "k1", "payload": "{}"}
        assert clients[role].post(f"/admin/console/runs/{run.pk}/signal/", signal).status_code == 403, role
    assert _rows() == before and Run.objects.get(pk=run.pk).state == "running"
    # The pages say who may act instead of showing forms another role would be refused.
    auditor_page = clients["auditor"].get(f"/admin/console/runs/{run.pk}/").content.decode()
    assert 'id="signal-form"' not in auditor_page and 'id="cancel-form"' not in auditor_page
    assert "Sending signals is for the operators and reviewers groups." in auditor_page
    reviewer_page = clients["reviewer"].get(f"/admin/console/runs/{run.pk}/").content.decode()
    assert 'id="signal-form"' in reviewer_page and 'id="cancel-form"' not in reviewer_page
    assert 'id="start-run-form"' not in clients["reviewer"].get("/admin/console/runs/").content.decode()
    assert 'id="start-run-form"' in clients["operator"].get("/admin/console/runs/").content.decode()
    # The nav links the runs list on every console page.
    assert 'href="/admin/console/runs/"' in clients["auditor"].get("/admin/console/").content.decode()


@pytest.mark.django_db
def test_an_operator_starts_a_run_from_the_form_and_each_persons_read_is_audited(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    operator = clients["operator"]
    data = {"log": str(tmp_path / "e")}
    response = operator.post("/admin/console/runs/start/", _start_form(input=json.dumps(data), idempotency_key="t-1"))
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/admin/console/runs/{run.pk}/"
    assert (run.definition, run.version, run.input, run.idempotency_key, run.created_by) == ("ticket", 1, data, "t-1", "olga")
    assert AuditEvent.objects.filter(action="run.start", actor="olga", target_type="run", target_id=str(run.pk)).count() == 1
    # The same key and input again: the same run, nothing new started, and the page says so.
    again = operator.post("/admin/console/runs/start/", _start_form(input=json.dumps(data), idempotency_key="t-1"), follow=True)
    assert Run.objects.count() == 1 and "already started with this key and input" in again.content.decode()
    reads = AuditEvent.objects.filter(action="read", target_type="run", target_id=str(run.pk))
    seen = reads.count()  # the redirect's journal read
    page = clients["auditor"].get(f"/admin/console/runs/{run.pk}/").content.decode()
    assert reads.count() == seen + 1 and reads.order_by("-id")[0].actor == "aude"
    assert 'data-step="classify"' in page and 'data-step="approval"' in page and 'data-step="send"' in page
    listed = clients["auditor"].get("/admin/console/runs/?state=running&definition=ticket").content.decode()
    assert f'data-run="{run.pk}"' in listed
    row = AuditEvent.objects.filter(action="read", target_type="run_list", actor="aude").get()
    assert row.details["state"] == "running" and row.details["definition"] == "ticket"
    # A filter that matches nothing lists nothing (no widening); a 404 for a run that is not there, unaudited.
    assert f'data-run="{run.pk}"' not in clients["auditor"].get("/admin/console/runs/?state=failed").content.decode()
    missing = reads.count()
    assert clients["auditor"].get("/admin/console/runs/999999/").status_code == 404
    assert AuditEvent.objects.filter(action="read", target_type="run", target_id="999999").count() == 0
    assert reads.count() == missing


@pytest.mark.django_db
def test_the_runs_list_pages_by_id_newest_first(clients: dict[str, Client], redis_clean: None, tmp_path: Path) -> None:
    from console.selectors.runs import PAGE_SIZE

    ids = [
        services.start_run(definition="ticket", version=1, input={"log": str(tmp_path / "e"), "n": n}, actor="s").run.pk
        for n in range(PAGE_SIZE + 3)
    ]
    first = clients["auditor"].get("/admin/console/runs/").content.decode()
    shown = [int(i) for i in re.findall(r'data-run="(\d+)"', first)]
    assert shown == sorted(ids, reverse=True)[:PAGE_SIZE]
    older = re.search(r'href="\?before=(\d+)" rel="next"', first)
    assert older is not None and int(older.group(1)) == shown[-1]
    second = clients["auditor"].get(f"/admin/console/runs/?before={older.group(1)}").content.decode()
    assert [int(i) for i in re.findall(r'data-run="(\d+)"', second)] == sorted(ids, reverse=True)[PAGE_SIZE:]
    assert 'rel="next"' not in second


@pytest.mark.django_db
def test_every_bad_start_is_a_clear_form_error_and_starts_nothing(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    operator = clients["operator"]
    log = str(tmp_path / "e")
    services.start_run(definition="ticket", version=1, input={"log": log}, idempotency_key="taken", actor="setup")
    before = _rows()
    cases = {
        "not JSON": _start_form(input="{log: 1"),
        "a JSON object ({…}), not a list": _start_form(input="[1, 2]"),
        "Select a valid choice": _start_form(definition="no_such_flow"),
        "unknown_version: workflow &#x27;ticket&#x27; has no version 7": _start_form(version="7", input=json.dumps({"log": log})),
        "bad_input: the input of ticket@1 is missing required field(s): log": _start_form(input="{}"),
        "idempotency_conflict": _start_form(input=json.dumps({"log": log, "other": 1}), idempotency_key="taken"),
        "Ensure this value is greater than or equal to 1": _start_form(version="0"),
    }
    for said, form in cases.items():
        response = operator.post("/admin/console/runs/start/", form)
        assert response.status_code == 400, said
        assert said in response.content.decode(), said
    assert _rows() == before


@pytest.mark.django_db
def test_signals_from_the_form_say_resumed_buffered_duplicate_or_rejected_and_bad_ones_change_nothing(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    reviewer = clients["reviewer"]
    run = services.start_run(definition="ticket", version=1, input={"log": str(tmp_path / "e")}, actor="setup").run
    url = f"/admin/console/runs/{run.pk}/signal/"
    # Before the wait exists (classify has not run): buffered.
    sent = reviewer.post(url, {"name": "reviewer.approved", "key": "r-1", "payload": '{"ok": true}'}, follow=True)
    assert "Signal reviewer.approved: buffered" in sent.content.decode()
    signal = Signal.objects.get(run=run)
    assert (signal.status, signal.sent_by, signal.payload) == ("buffered", "rita", {"ok": True})
    assert AuditEvent.objects.filter(action="run.signal", actor="rita", target_id=str(run.pk)).count() == 1
    again = reviewer.post(url, {"name": "reviewer.approved", "key": "r-1", "payload": "{}"}, follow=True)
    assert "Signal reviewer.approved: duplicate" in again.content.decode() and Signal.objects.count() == 1
    before = _rows()
    for said, form in {
        "not JSON": {"name": "x", "key": "k", "payload": "{"},
        "a JSON object ({…}), not a int": {"name": "x", "key": "k", "payload": "3"},
        "This field is required": {"name": "", "key": "k", "payload": "{}"},
        "signal_too_large": {"name": "x", "key": "k", "payload": json.dumps({"blob": "y" * 17_000})},
    }.items():
        response = reviewer.post(url, form)
        assert response.status_code == 400 and said in response.content.decode(), said
    assert _rows() == before
    assert reviewer.post("/admin/console/runs/999999/signal/", {"name": "x", "key": "k"}).status_code == 404
    # A finished run rejects it, by name, and keeps nothing.
    services.cancel_run(run_id=run.pk, actor="setup")
    late = reviewer.post(url, {"name": "reviewer.approved", "key": "r-2", "payload": "{}"}, follow=True)
    assert "Signal reviewer.approved: rejected" in late.content.decode() and Signal.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # the steps' bodies run here (claimed: committed rows)
def test_a_signal_from_the_console_resumes_the_wait_and_the_journal_shows_the_timeline(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    run = services.start_run(definition="ticket", version=1, input={"log": str(tmp_path / "e")}, actor="setup").run
    drain_until(lambda: _state(run.pk, "waiting"), what="the run to wait for its reviewer")
    sent = clients["reviewer"].post(
        f"/admin/console/runs/{run.pk}/signal/", {"name": "reviewer.approved", "key": "r-1", "payload": '{"by": "rita"}'}
    )
    assert sent.status_code == 302
    done = drain_until(lambda: _finished(run.pk), what="the run to finish")
    assert done.state == "succeeded"
    page = clients["auditor"].get(f"/admin/console/runs/{run.pk}/").content.decode()
    classify = page.split('data-step="classify"')[1].split("<!-- end of step")[0]
    worker = Job.objects.get(pk=RunStep.objects.get(run=run, name="classify").job_id).attempt_set.get().worker_id
    assert f'<code class="worker-id">{worker}</code>' in classify and "outcome-succeeded" in classify
    assert "&quot;label&quot;: &quot;billing&quot;" in classify  # its state after
    approval = page.split('data-step="approval"')[1].split("<!-- end of step")[0]
    assert "resumed by signal <code>reviewer.approved</code> key <code>r-1</code> from rita" in approval
    send = page.split('data-step="send"')[1].split("<!-- end of step")[0]
    assert "&quot;sent&quot;: true" in send and 'data-state="succeeded"' in page.split('data-step="send"')[1][:40]


@pytest.mark.django_db
def test_cancel_needs_its_confirmation_and_a_finished_run_refuses_by_name(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    operator = clients["operator"]
    run = services.start_run(definition="ticket", version=1, input={"log": str(tmp_path / "e")}, actor="setup").run
    url = f"/admin/console/runs/{run.pk}/cancel/"
    before = _rows()
    unconfirmed = operator.post(url, {"reason": "oops"})
    assert unconfirmed.status_code == 400 and "Tick the box to confirm the cancel." in unconfirmed.content.decode()
    assert _rows() == before and Run.objects.get(pk=run.pk).state == "running"
    job = RunStep.objects.get(run=run, name="classify").job_id
    with django_capture_on_commit_callbacks(execute=True):  # the run's jobs are cancelled once it commits
        done = operator.post(url, {"reason": "duplicate ticket", "confirm": "on"})
    assert done.status_code == 302
    cancelled = Run.objects.get(pk=run.pk)
    assert cancelled.state == "cancelled" and "olga" in cancelled.error and "duplicate ticket" in cancelled.error
    assert Job.objects.get(pk=job).state == "cancelled"
    assert AuditEvent.objects.filter(action="run.cancel", actor="olga", target_id=str(run.pk)).get().details == {
        "reason": "duplicate ticket"
    }
    after = _rows()
    refused = operator.post(url, {"confirm": "on"})
    assert refused.status_code == 400 and "run_finished: run" in refused.content.decode()
    assert _rows() == after


@pytest.mark.django_db
def test_a_stranded_run_is_listed_and_moved_by_an_explicit_audited_action(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    now = timezone.now()
    WorkerProcess.objects.create(
        name="rq.v2",
        hostname="h",
        pid=1,
        queues=["default"],
        kinds=[f"fan.{s}@2" for s in "abcd"],
        worker_class="rq",
        started_at=now,
        last_seen_at=now,
    )
    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="setup").run
    page = clients["auditor"].get("/admin/console/runs/stranded/").content.decode()
    row = page.split(f'data-run="{run.pk}"')[1].split("</tr>")[0]
    assert "<code>fan.a@1</code>" in row and "moving runs is for the operators group" in row
    operator = clients["operator"]
    form = operator.get("/admin/console/runs/stranded/").content.decode().split(f'data-run="{run.pk}"')[1].split("</tr>")[0]
    assert '<option value="2" selected>2 (served)</option>' in form
    before = _rows()
    url = f"/admin/console/runs/{run.pk}/move/"
    for said, data in {
        "Tick the box to confirm the move.": {"to_version": "2"},
        "unknown_version": {"to_version": "9", "confirm": "on"},
        "Enter a whole number": {"to_version": "two", "confirm": "on"},
    }.items():
        response = operator.post(url, data)
        assert response.status_code == 400 and said in response.content.decode(), said
    assert _rows() == before and Run.objects.get(pk=run.pk).version == 1
    moved = operator.post(url, {"to_version": "2", "confirm": "on"}, follow=True)
    assert "now at fan@2" in moved.content.decode() and f'data-run="{run.pk}"' not in moved.content.decode()
    assert Run.objects.get(pk=run.pk).version == 2
    assert AuditEvent.objects.filter(action="run.move", actor="olga", target_id=str(run.pk)).get().details == {
        "from_version": 1,
        "to_version": 2,
    }
    assert operator.post("/admin/console/runs/999999/move/", {"to_version": "2", "confirm": "on"}).status_code == 404


@pytest.mark.django_db(transaction=True)  # the steps' bodies run here (claimed: committed rows)
def test_the_journal_masks_a_runs_secrets_everywhere_and_nests_the_bodys_spans_under_the_attempt(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    data = {"log": str(tmp_path / "e"), "api_key": SECRET}
    run = services.start_run(definition="secretive", version=1, input=data, actor="setup").run
    drain_until(lambda: _state(run.pk, "waiting"), what="the run to wait")
    services.send_signal(run_id=run.pk, name="go", key="g-1", payload={"token": "tok-9f8e7d6c5b4a3f2e1d0c"}, actor="setup")
    failed = drain_until(lambda: _finished(run.pk), what="the run to fail")
    assert failed.state == "failed"
    # The stored rows do carry it (the body put it there): what is masked is what a person sees.
    assert SECRET in json.dumps(RunStep.objects.get(run=run, name="use").output)
    page = clients["auditor"].get(f"/admin/console/runs/{run.pk}/").content.decode()
    assert SECRET not in page and SECRET[8:30] not in page
    assert "tok-9f8e7d6c5b4a3f2e1d0c" not in page
    assert "[redacted]" in page
    use = page.split('data-step="use"')[1].split("<!-- end of step")[0]
    # The attempt's own span, the body's "lookup" under it and "inner" under that, each at its depth.
    depths = re.findall(r'<li class="span" data-depth="(\d)"[^>]*>(?:└ )?<strong>([^<]+)</strong>', use)
    assert [(int(d), name) for d, name in depths][1:] == [(1, "lookup"), (2, "inner")]
    assert depths[0][0] == "0"
    assert "called with [redacted]" in use and "input_tokens 12" in use
    fail = page.split('data-step="fail"')[1].split("<!-- end of step")[0]
    assert "refused [redacted]" in fail
    # The admin's read-only pages mask it too, and refuse edits.
    admin = clients["auditor"]
    for url in (
        f"/admin/flows/run/{run.pk}/change/",
        f"/admin/flows/runstep/{RunStep.objects.get(run=run, name='use').pk}/change/",
        f"/admin/flows/signal/{Signal.objects.get(run=run).pk}/change/",
        "/admin/flows/run/",
    ):
        response = admin.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode() and "tok-9f8e7d6c5b4a3f2e1d0c" not in response.content.decode(), url
    assert admin.get("/admin/flows/run/add/").status_code == 403
    assert admin.post(f"/admin/flows/run/{run.pk}/change/", {"state": "running"}).status_code == 403
    assert Run.objects.get(pk=run.pk).state == "failed"


@pytest.mark.django_db(transaction=True)
def test_a_journal_without_stored_spans_shows_the_steps_alone(
    clients: dict[str, Client], redis_clean: None, tmp_path: Path
) -> None:
    from traces.models import Span

    run = services.start_run(definition="ticket", version=1, input={"log": str(tmp_path / "e")}, actor="setup").run
    drain_until(lambda: _state(run.pk, "waiting"), what="the run to wait")
    Span.objects.all().delete()  # the trace pruned, or recorded before traces existed
    page = clients["auditor"].get(f"/admin/console/runs/{run.pk}/").content.decode()
    assert "No span is stored for this run: the steps alone." in page
    assert 'data-step="classify" data-state="succeeded"' in page and 'class="span"' not in page
