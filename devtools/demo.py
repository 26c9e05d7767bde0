"""What ``koala_demo`` seeds beside its jobs: the demo's people and their stored logins, and one
uncertain operation made by the sandbox provider's real behaviour.

The people match the documentation's examples (docs/safety.md, docs/exports.md, README):

- ``admin``: superuser;
- ``alice``: the requester, a reviewer and a member of ``acme``; she enqueued the demo's two
  charges above the review threshold, so four-eyes keeps her from approving them;
- ``bob``: the second reviewer, who may approve them;
- ``carol``: an auditor (reads the console) and a member of ``globex``: she may request and
  download exports of globex only.

Their logins are printed and kept in ``$KOALA_DATA_DIR/logins.json`` (mode 0600), a JSON list
of ``{"username", "password", "roles"}``, so the passwords stay valid across runs and
``make run``'s banner can show them.
"""

from __future__ import annotations

import os
import secrets
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from devtools import logins as login_store
from devtools.sandbox.provider import ProviderControl
from workers.models import Job, JobState, ParkReason
from workers.runtime import get_runtime
from workers.services import leases
from workers.services.jobs import enqueue

SANDBOX_STATE_FILE = "sandbox-provider.jsonl"
UNCERTAIN_KEY = "demo-order-4"  # the idempotency key of the demo's uncertain charge


@dataclass(frozen=True)
class Person:
    username: str
    groups: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()  # demo account slugs the person is a member of
    superuser: bool = False
    what: str = ""  # the part the person plays, first in their roles

    @property
    def roles(self) -> list[str]:
        named = [self.what] if self.what else []
        named += ["superuser"] if self.superuser else []
        return named + list(self.groups) + [f"member of {slug}" for slug in self.accounts]


PEOPLE = (
    Person("alice", groups=("reviewers",), accounts=("acme",), what="requester"),
    Person("bob", groups=("reviewers",)),
    Person("carol", groups=("auditors",), accounts=("globex",)),
)


# Where make run keeps its state (KOALA_DATA_DIR, or .koala-data/ in the checkout).
data_dir = login_store.data_dir


def sandbox_state_file() -> Path:
    """The sandbox provider's record of its effects under make run (koala_run starts it with this)."""
    return data_dir() / SANDBOX_STATE_FILE


def _stored_passwords(folder: Path) -> dict[str, str]:
    """The passwords of an earlier run, so the printed logins stay valid (devtools/logins.py
    also reads the old demo-admin-password file of a data folder made before logins.json)."""
    return {login.username: login.password for login in login_store.read(folder)[0]}


def ensure_people(*, admin: str) -> tuple[list[login_store.Login], list[str]]:
    """The demo's people with their passwords set (kept from an earlier run), and any problem to say."""
    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stored = _stored_passwords(folder)
    legacy = folder / login_store.LEGACY_ADMIN_FILE
    if admin not in stored and legacy.exists():  # an admin not named "admin" kept the old file too
        stored[admin] = legacy.read_text().strip()
    users = get_user_model()
    problems: list[str] = []
    logins = []
    for person in (Person(admin, superuser=True), *PEOPLE):
        password = stored.get(person.username) or secrets.token_urlsafe(12)
        user, _ = users.objects.get_or_create(username=person.username)
        user.is_staff = True
        user.is_superuser = person.superuser
        user.email = user.email or f"{person.username}@example.com"
        user.set_password(password)
        user.save()
        groups = list(Group.objects.filter(name__in=person.groups))
        missing = set(person.groups) - {g.name for g in groups}
        if missing:
            problems.append(f"group(s) {', '.join(sorted(missing))} missing (migrate creates them): {person.username} lacks them")
        user.groups.add(*groups)
        logins.append(login_store.Login(person.username, password, tuple(person.roles)))
    return logins, problems


def write_logins(logins: list[login_store.Login]) -> Path:
    """logins.json (mode 0600, replaced whole: devtools/logins.py), superseding the old admin file."""
    path = login_store.write(logins)
    (data_dir() / login_store.LEGACY_ADMIN_FILE).unlink(missing_ok=True)
    return path


def ensure_api_key(*, actor: str) -> tuple[str, Path]:
    """The demo's API key for workers and job calls (scopes worker + execute), kept in the data
    folder like the logins: the same key on every run while it still authenticates."""
    from api import keys
    from api.http import ApiError

    raw, source = login_store.read_api_key()
    if raw and source is not None:
        try:
            keys.authenticate(f"Bearer {raw}")
            return raw, source
        except ApiError:
            pass  # revoked, expired or from another database: make a new one
    _, raw = keys.create_key(name="demo worker", scopes=["worker", "execute"], actor=actor)
    return raw, login_store.write_api_key(raw)


def grant_memberships(*, actor: str) -> None:
    """The demo people's account memberships (the accounts exist once the demo data is loaded)."""
    from exports.models import Account
    from exports.services import grant_account_access

    for person in PEOPLE:
        for slug in person.accounts:
            account = Account.objects.filter(slug=slug).first()
            if account is not None and not account.members.filter(username=person.username).exists():
                grant_account_access(account_id=account.pk, username=person.username, actor=actor)


# -- one operation that needs a person ---------------------------------------------------------------


def _sandbox() -> tuple[str, int] | None:
    """The sandbox provider koala_run runs for this demo (its URL and port), or None: a provider
    someone configured is never scripted with faults."""
    port = os.environ.get("KOALA_SANDBOX_PORT", "")
    url = settings.KOALA_PAYMENTS_URL
    if not port.isdigit() or url != f"http://127.0.0.1:{port}":
        return None
    return url, int(port)


@contextmanager
def _reachable(url: str, port: int) -> Iterator[ProviderControl]:
    """The sandbox, running: the one already listening (koala_demo run again beside make run), or,
    before koala_run has started its own, the same provider in a thread on its port and record
    (koala_run's sandbox then reads that record and knows everything done here)."""
    control = ProviderControl(url, sandbox_state_file())
    try:
        control.stats()
    except (urllib.error.URLError, OSError):
        from devtools.sandbox.provider import FakeProvider

        provider = FakeProvider(sandbox_state_file(), api_key=settings.KOALA_PAYMENTS_API_KEY, port=port).start()
        try:
            yield provider
        finally:
            provider.stop()
        return
    yield control


def _run_in_this_process(job_id: int, *, seconds: float = 15.0) -> Job:
    """Run the job's attempts here, through the real runtime, until it leaves the queue for good
    (between attempts it waits out its backoff, as a worker would)."""
    runtime = get_runtime()
    deadline = time.monotonic() + seconds
    job = Job.objects.get(pk=job_id)
    while job.state in (JobState.QUEUED, JobState.RUNNING) and time.monotonic() < deadline:
        lease = leases.claim_job(job_id=job_id, worker=runtime.name, lease_seconds=runtime.lease_seconds)
        if lease is None:
            time.sleep(0.1)  # not due yet (its retry's backoff), or someone else's attempt runs
        else:
            runtime.run(lease)
        job = Job.objects.get(pk=job_id)
    return job


def seed_uncertain_operation(*, stdout: Any) -> None:
    """A charge whose outcome nobody can tell, parked for a person on Needs attention.

    Made the way it happens in production: the sandbox answers the charge with a 503 (Koala cannot
    know whether it took effect: ``OutcomeUnknown``), and the look-up by idempotency key that the
    next attempt makes answers 501 (no look-up: nothing to reconcile with). Both faults are for one
    request each. The charge did not happen at the sandbox: "did not happen" is the right answer
    (the job then re-sends it under the same key); the sandbox's own record says so.
    """
    if Job.objects.filter(kind="shop.order_and_charge", idempotency_key=UNCERTAIN_KEY).exists():
        return
    sandbox = _sandbox()
    if sandbox is None:
        stdout.write("No sandbox provider: no uncertain operation seeded (a configured provider is never scripted).")
        return
    with _reachable(*sandbox) as provider:
        provider.fault("5xx", resource="charges", times=1, status=503, message="upstream timeout")
        provider.fault("lookup_disabled", resource="charges", times=1)
        job = enqueue(
            kind="shop.order_and_charge",
            input={"reference": UNCERTAIN_KEY, "amount_minor": 1800, "currency": "EUR"},
            idempotency_key=UNCERTAIN_KEY,
            created_by="koala_demo",
        )
        done = _run_in_this_process(job.job_id)
    if done.state == JobState.PARKED and done.park_reason == ParkReason.NEEDS_ATTENTION:
        stdout.write(
            f"Needs attention: the charge of {UNCERTAIN_KEY} (job {done.pk}) got a 503 and the sandbox could not be asked; "
            "resolve it at /admin/console/attention/ (it did not happen: the sandbox has no charge under its key)"
        )
    else:
        stdout.write(f"The demo's uncertain charge (job {done.pk}) ended {done.state} (not parked): {done.error_message}")
