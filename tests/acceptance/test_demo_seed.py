"""What ``koala_demo`` seeds, run as ``make run`` runs it (a subprocess with make run's settings and
the loopback provider as its sandbox): the people the docs use, their stored logins, and one
operation that needs attention, made by the sandbox's real behaviour."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User

from devtools.sandbox.provider import FakeProvider
from exports.models import Account
from tests.inprocess import run_until
from tests.support.console import ensure_roles
from tests.support.demo import demo_env, manage
from tests.support.effects import PROVIDER_API_KEY
from workers.models import Job, Operation
from workers.services.operations import needing_attention, resolve_operation

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # koala_demo subprocesses, ~7 s each

ROLES = {
    "admin": ["superuser"],
    "alice": ["requester", "reviewers", "member of acme"],
    "bob": ["reviewers"],
    "carol": ["auditors", "member of globex"],
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_demo_seeds_the_people_of_the_docs_and_one_operation_needing_attention(
    provider: FakeProvider, tmp_path: Path, redis_clean: None
) -> None:
    ensure_roles()
    env = demo_env(tmp_path, sandbox_url=provider.url, sandbox_port=provider.port, api_key=PROVIDER_API_KEY)
    done = manage("koala_demo", env=env)
    assert done.returncode == 0, done.stderr

    # The logins: a JSON list of {username, password, roles}, readable by its owner only, said where.
    stored = tmp_path / "logins.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    logins = json.loads(stored.read_text())
    assert [sorted(entry) for entry in logins] == [["password", "roles", "username"]] * 4
    assert {entry["username"]: entry["roles"] for entry in logins} == ROLES
    assert f"Stored in {stored}" in done.stdout
    for entry in logins:
        assert f"{entry['username']:<8} password={entry['password']}" in done.stdout
        user = authenticate(username=entry["username"], password=entry["password"])
        assert user is not None and user.is_staff, entry["username"]
    groups = {u.username: sorted(u.groups.values_list("name", flat=True)) for u in User.objects.all()}
    assert groups == {"admin": [], "alice": ["reviewers"], "bob": ["reviewers"], "carol": ["auditors"]}
    assert User.objects.get(username="admin").is_superuser and not User.objects.get(username="alice").is_superuser
    members = {a.slug: sorted(a.members.values_list("username", flat=True)) for a in Account.objects.all()}
    assert members == {"acme": ["admin", "alice"], "globex": ["admin", "carol"], "initech": ["admin"]}
    # Alice requested the charges that wait for a reviewer (four-eyes keeps her from approving them).
    charges = Job.objects.filter(created_by="alice", kind="shop.order_and_charge")
    assert set(charges.values_list("idempotency_key", flat=True)) == {"demo-order-2", "demo-order-3"}

    # One operation needs attention: the sandbox answered the charge 503 and could not be asked.
    [operation] = needing_attention()
    job = Job.objects.get(pk=operation.job_id)
    assert (job.idempotency_key, job.state, job.park_reason) == ("demo-order-4", "parked", "needs_attention")
    assert (operation.name, operation.key, operation.state) == ("charge", "demo-order-4:charge", "uncertain")
    assert [r["status"] for r in provider.requests("charges", key=operation.key)] == [503]
    assert [r["status"] for r in provider.lookups("charges", key=operation.key)] == [501]
    assert provider.effects("charges") == []  # it did not happen
    assert [f["times"] for f in provider.stats()["faults"]] == [0, 0]  # one request each: nothing lingers
    assert "Needs attention: the charge of demo-order-4" in done.stdout

    # Safe to run again: the same passwords, no new job, still one operation needing attention.
    jobs = Job.objects.count()
    again = manage("koala_demo", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(stored.read_text()) == logins
    assert Job.objects.count() == jobs and needing_attention().count() == 1


def test_under_make_run_the_sandbox_that_starts_later_knows_what_the_demo_did(
    tmp_path: Path,
    redis_clean: None,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    """koala_run seeds before it starts its sandbox: the demo stands in for it on its port and
    record, and the sandbox then started on them answers as the same provider."""
    ensure_roles()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    done = manage("koala_demo", env=demo_env(tmp_path, sandbox_url=url, sandbox_port=port))
    assert done.returncode == 0, done.stderr
    [operation] = needing_attention()
    sandbox = FakeProvider(tmp_path / "sandbox-provider.jsonl", port=port).start()  # what koala_run starts next
    try:
        settings.KOALA_PAYMENTS_URL = settings.KOALA_MODELS_URL = url
        assert sandbox.effects("charges") == [] and len(sandbox.effects("orders", key="demo-order-4:order")) == 1
        # A person checks the sandbox (no charge under the key) and records "it did not happen".
        resolve_operation(operation_id=operation.pk, happened=False, note="no charge under its key at the sandbox", actor="admin")
        job = run_until(operation.job_id, "succeeded")  # (the other demo jobs run too, as make run's worker would)
        [charge] = sandbox.effects("charges", key=operation.key)
        assert job.result["charge"] == charge["id"] and charge["amount_minor"] == 1800
        assert Operation.objects.get(pk=operation.pk).state == "succeeded"
    finally:
        sandbox.stop()


def test_a_configured_provider_is_never_scripted(provider: FakeProvider, tmp_path: Path, redis_clean: None) -> None:
    ensure_roles()
    done = manage("koala_demo", env=demo_env(tmp_path, sandbox_url=provider.url, api_key=PROVIDER_API_KEY))
    assert done.returncode == 0, done.stderr
    assert "No sandbox provider: no uncertain operation seeded" in done.stdout
    assert not needing_attention().exists() and provider.stats()["faults"] == []
    assert not Job.objects.filter(idempotency_key="demo-order-4").exists()
