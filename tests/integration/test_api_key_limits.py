"""API keys limited to job kinds and queues: what a key may serve (register) and start, read and
cancel (the job calls). Limits are set when the key is created (service, command, admin),
refused there when they name what Koala does not know, and hold before anything is written.
The worker protocol over a real server: tests/acceptance/test_api_key_limits.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.test import Client

from api import protocol
from api.http import ApiError
from api.keys import ApiKeyError, authenticate, create_key, forget_cached
from api.models import ApiKey
from koala.audit import AuditAction
from koala.models import AuditEvent
from tests.integration.test_command_input import table_state
from tests.support.apikeys import bearer, new_key
from workers.models import Job, JobState, WorkerProcess
from workers.services.jobs import enqueue

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget_cached()
    yield
    forget_cached()


def test_a_key_keeps_its_kinds_and_queues_and_audits_them() -> None:
    row, raw = new_key("worker", name="billing", kinds=["http.probe@1", "noop", "noop"], queues=["default"])
    stored = ApiKey.objects.get(pk=row.pk)
    assert (stored.kinds, stored.queues) == (["http.probe@1", "noop"], ["default"])
    principal = authenticate(f"Bearer {raw}")
    assert principal.allows(kind="noop", version=1, queue="default")
    assert principal.allows(kind="http.probe", version=1, queue="default")
    assert not principal.allows(kind="http.probe", version=2, queue="default")  # another version
    assert not principal.allows(kind="noop", version=1, queue="critical")  # another queue
    assert not principal.allows(kind="boom", version=1, queue="default")
    details = AuditEvent.objects.get(action=AuditAction.API_KEY_CREATED).details
    assert (details["kinds"], details["queues"]) == (["http.probe@1", "noop"], ["default"])
    # No limits: any kind, any queue.
    anything = authenticate(f"Bearer {new_key('worker')[1]}")
    assert anything.allows(kind="boom", version=1, queue="bulk")


@pytest.mark.parametrize(
    ("limits", "field", "message"),
    [
        ({"kinds": ["nope"]}, "kinds", "unknown job kind 'nope'"),
        ({"kinds": ["noop@9"]}, "kinds", "has no version 9"),
        ({"kinds": ["nope@1"]}, "kinds", "unknown job kind 'nope'"),
        ({"kinds": ["noop@"]}, "kinds", "is not a job kind"),
        ({"kinds": ["@1"]}, "kinds", "is not a job kind"),
        ({"kinds": ["noop@one"]}, "kinds", "is not a job kind"),
        ({"kinds": ["noop@0"]}, "kinds", "is not a job kind"),
        ({"kinds": [""]}, "kinds", "is not a job kind"),
        ({"kinds": ["no\x00op"]}, "kinds", "is not a job kind"),
        ({"queues": ["nope"]}, "queues", "unknown queue 'nope'"),
        ({"queues": ["default", ""]}, "queues", "unknown queue ''"),
    ],
)
def test_limits_naming_what_koala_does_not_know_are_refused_and_change_nothing(
    limits: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ApiKeyError, match=message) as refused:
        create_key(name="k", scopes=["worker"], actor="ops", **limits)
    assert refused.value.field == field
    assert not ApiKey.objects.exists() and not AuditEvent.objects.exists()


def test_the_database_keeps_limits_lists() -> None:
    row, _ = new_key("worker")
    for field in ("kinds", "queues"):
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKey.objects.filter(pk=row.pk).update(**{field: "noop"})


def run(*args: str) -> str:
    out = StringIO()
    call_command("koala_apikey", *args, stdout=out)
    return out.getvalue()


def test_the_command_creates_and_lists_limited_keys() -> None:
    printed = run("create", "--name", "billing", "--scope", "worker", "--kinds", "http.probe@1, noop", "--queues", "default")
    row = ApiKey.objects.get()
    assert (row.kinds, row.queues) == (["http.probe@1", "noop"], ["default"])
    assert "kinds http.probe@1,noop; queues default" in printed.splitlines()[0]
    run("create", "--name", "any", "--scope", "execute")
    listed = run("list")
    assert f"kk_{row.prefix}  billing  scopes=worker  kinds=http.probe@1,noop  queues=default" in listed
    assert "any  scopes=execute  kinds=any  queues=any" in listed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kinds", "nope"], "kinds: unknown job kind 'nope'"),
        (["--kinds", "noop,,boom"], "empty name"),
        (["--kinds", ""], "cannot be empty"),
        (["--queues", "default,nope"], "queues: unknown queue 'nope'"),
    ],
)
def test_the_command_refuses_unknown_limits(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run("create", "--name", "k", "--scope", "worker", *args)
    assert not ApiKey.objects.exists() and not AuditEvent.objects.exists()


def test_the_admin_creates_a_limited_key_and_refuses_unknown_kinds(client: Client) -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "x")
    client.force_login(root)
    form = {"name": "billing", "scopes": ["worker"], "kinds": "http.probe@1, noop", "queues": ["default", "critical"]}
    refused = client.post("/admin/api/apikey/add/", {**form, "kinds": "noop, nope"})
    assert refused.status_code == 200 and "unknown job kind &#x27;nope&#x27;" in refused.content.decode()
    assert not ApiKey.objects.exists()
    created = client.post("/admin/api/apikey/add/", form)
    assert created.status_code == 302, created.content.decode()[-2000:]
    row = ApiKey.objects.get()
    assert (row.kinds, row.queues) == (["http.probe@1", "noop"], ["critical", "default"])
    listing = client.get("/admin/api/apikey/").content.decode()
    assert "http.probe@1, noop" in listing and "critical, default" in listing


# -- register: what a worker serves is all it claims -------------------------------------------------


def _register(raw: str, kinds: list[tuple[str, int]], queues: list[str] | None = None, name: str = "w1") -> Any:
    principal = authenticate(f"Bearer {raw}")  # (its first use here moves last_used_at)
    return protocol.register(
        key_prefix=principal.prefix,
        name=name,
        hostname="h",
        pid=1,
        served_kinds=[(kind, version, []) for kind, version in kinds],
        queues=queues,
        concurrency=1,
        principal=principal,
    )


@pytest.mark.parametrize(
    ("kinds", "queues", "message"),
    [
        ([("http.once", 1)], None, "kinds: http.once@1 outside the kinds of key"),
        ([("http.probe", 1), ("http.probe", 2)], None, "kinds: http.probe@2 outside"),
        ([("http.probe", 1)], ["critical"], "queues: critical outside the queues of key"),
        ([("http.probe", 1)], ["default", "bulk"], "queues: bulk outside"),
    ],
)
def test_register_refuses_kinds_and_queues_outside_the_keys_limits(
    kinds: list[tuple[str, int]], queues: list[str] | None, message: str
) -> None:
    _, raw = new_key("worker", kinds=["http.probe@1"], queues=["default"])
    authenticate(f"Bearer {raw}")
    before = table_state()
    with pytest.raises(ApiError) as refused:
        _register(raw, kinds, queues)
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    assert message in refused.value.message
    assert table_state() == before and not WorkerProcess.objects.exists()


def test_register_within_the_limits_and_a_re_registration_outside_them_keeps_the_first(settings: Any) -> None:
    _, raw = new_key("worker", kinds=["http.probe"], queues=["default"])
    registered = _register(raw, [("http.probe", 1), ("http.probe", 2)])
    assert registered.served == ("http.probe@1", "http.probe@2") and registered.queues == ("default",)
    with pytest.raises(ApiError, match=r"http\.once@1 outside"):
        _register(raw, [("http.probe", 1), ("http.once", 1)])  # the same name, a restart asking for more
    assert WorkerProcess.objects.get(name="w1").kinds == ["http.probe@1", "http.probe@2"]
    # A key limited to queues names them: the kinds' own queue is not assumed.
    _, other = new_key("worker", queues=["critical"])
    with pytest.raises(ApiError, match="queues: default outside"):
        _register(other, [("http.probe", 1)], name="w2")
    assert _register(other, [("http.probe", 1)], ["critical"], name="w2").queues == ("critical",)


# -- the job calls: a limited key starts, reads and cancels only its own kinds and queues -------------


def post(client: Client, url: str, body: Any, auth: dict[str, str]) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json", **auth)


@pytest.mark.urls("tests.web.api_runs_urls")
def test_a_limited_execute_key_starts_reads_and_cancels_only_within_its_limits(client: Client) -> None:
    auth = bearer(new_key("execute", kinds=["noop", "http.probe@1"], queues=["default", "bulk"])[1])
    authenticate(auth["HTTP_AUTHORIZATION"])  # its first use moves last_used_at: not the calls' doing
    before = table_state()
    for body, field in [
        ({"kind": "boom", "input": {}}, "kind"),
        ({"kind": "http.probe", "input": {}}, "kind"),  # latest is version 2
        ({"kind": "http.probe", "version": 2, "input": {}}, "kind"),
        ({"kind": "noop", "input": {}, "queue": "critical"}, "queue"),
    ]:
        refused = post(client, "/api/v1/jobs", body, auth)
        assert refused.status_code == 403, (body, refused.content)
        assert refused.json()["error"] == "forbidden" and refused.json()["message"].startswith(f"{field}: "), refused.json()
    assert table_state() == before
    assert post(client, "/api/v1/jobs", {"kind": "http.probe", "version": 1, "input": {}}, auth).status_code == 201
    mine = post(client, "/api/v1/jobs", {"kind": "noop", "input": {"n": 1}, "queue": "bulk", "delay_seconds": 60}, auth)
    assert mine.status_code == 201
    assert client.get(f"/api/v1/jobs/{mine.json()['job_id']}", **auth).status_code == 200

    # Another kind's job, and one of its kinds on another queue: answered as if they did not exist.
    theirs = enqueue(kind="boom", input={"card": "4111111111111111"}, delay_seconds=60).job_id
    elsewhere = enqueue(kind="noop", input={}, queue="critical", delay_seconds=60).job_id
    for job_id in (theirs, elsewhere):
        read = client.get(f"/api/v1/jobs/{job_id}", **auth)
        assert (read.status_code, read.json()) == (404, {"error": "not_found", "message": f"no job {job_id}"})
        cancel = post(client, f"/api/v1/jobs/{job_id}/cancel", {"reason": "x"}, auth)
        assert cancel.status_code == 404
        assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    assert not AuditEvent.objects.filter(action=AuditAction.CANCEL).exists()
