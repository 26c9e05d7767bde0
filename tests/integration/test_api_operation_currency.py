"""An HTTP worker's step names the currency of its amount, or none: the operation keeps it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from api import protocol
from api.keys import forget_cached
from tests.support.apikeys import bearer, new_key
from workers.models import Operation
from workers.services.jobs import enqueue

# transaction=True: the worker calls run in the API hub's thread pool, on their own connections.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget_cached()
    yield
    forget_cached()


def call(client: Client, path: str, body: dict[str, Any], auth: dict[str, str]) -> Any:
    return client.post(f"/api/v1/{path}", json.dumps(body), content_type="application/json", **auth)


def test_a_steps_currency_is_checked_and_kept(settings: Any, redis_clean: None) -> None:
    settings.KOALA_COST_CURRENCY = "CHF"
    key, raw = new_key("worker", name="http workers")
    client, auth = Client(), bearer(raw)
    registered = call(client, "workers/register", {"name": "w-cur", "kinds": ["http.probe@2"]}, auth)
    assert registered.status_code == 200, registered.content
    enqueue(kind="http.probe", input={"n": 1})
    # The lease as acquire hands it out (the long poll itself is the acceptance tests').
    worker = protocol.registration(worker_id="w-cur", key_prefix=key.prefix)
    [lease] = protocol.claim_for(worker, count=1, state=protocol.claim_pass())
    token = protocol.lease_token(attempt_id=lease.attempt_id, lease_token=lease.lease_token, worker_id="w-cur")
    who = {"worker_id": "w-cur", "lease_token": token}
    path = f"leases/{lease.attempt_id}/operations"
    step = {**who, "kind": "payout", "params": {"n": 1}, "amount_minor": 500}
    for bad in ("eu", "eur", "E1R"):
        refused = call(client, path, {**step, "name": f"pay-{bad}", "currency": bad}, auth)
        assert refused.status_code == 400 and refused.json()["message"].startswith("currency:"), refused.content
    assert not Operation.objects.exists()
    for name, currency in (("in-yen", "JPY"), ("in-cost", None)):
        begun = call(client, path, {**step, "name": name, **({"currency": currency} if currency else {})}, auth)
        assert begun.status_code == 200 and begun.json()["action"] == "send", begun.content
    assert dict(Operation.objects.values_list("name", "currency")) == {"in-yen": "JPY", "in-cost": "CHF"}
