"""API keys (R19): shown once and stored hashed; refused cleanly (401/403); cheap to check;
revoked at once in the process; audited when created and revoked; never a login."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api import keys
from api.http import ApiError
from api.keys import KeyScope, authenticate, create_key, forget_cached, require, revoke_key
from api.models import ApiKey
from koala.audit import AuditAction
from koala.models import AuditEvent
from tests.support.apikeys import new_key
from workers import doorbell

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget_cached()
    yield
    forget_cached()


def refusal(header: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        authenticate(header)
    return caught.value


def test_a_new_key_is_returned_once_and_only_its_hash_is_stored() -> None:
    row, raw = new_key("worker", "execute", name="billing workers")
    assert raw.startswith(f"kk_{row.prefix}_") and len(raw.split("_", 2)[2]) >= 32
    stored = ApiKey.objects.get(pk=row.pk)
    assert stored.secret_hash == hashlib.sha256(raw.encode()).hexdigest()
    secret = raw.split("_", 2)[2]
    dumped = " ".join(str(v) for v in ApiKey.objects.filter(pk=row.pk).values().get().values())
    assert secret not in dumped and raw not in dumped
    assert stored.scopes == ["worker", "execute"]
    event = AuditEvent.objects.get(action=AuditAction.API_KEY_CREATED)
    assert (event.actor, event.target_id) == ("setup", row.prefix)
    assert secret not in str(event.details)
    principal = authenticate(f"Bearer {raw}")
    assert (principal.key_id, principal.prefix, principal.person) == (row.pk, row.prefix, "")
    assert principal.scopes == frozenset({"worker", "execute"})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"scopes": []}, "scope"),
        ({"scopes": ["root"]}, "scope"),
        ({"name": ""}, "name"),
        ({"name": "n" * 101}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"actor": ""}, "actor"),
        ({"person": "nobody"}, "person"),
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "expires_at"),
    ],
)
def test_bad_key_requests_change_nothing(kwargs: dict, field: str) -> None:
    given = {"name": "k", "scopes": ["worker"], "actor": "ops", **kwargs}
    with pytest.raises(keys.ApiKeyError) as caught:
        create_key(**given)
    assert caught.value.field == field
    assert ApiKey.objects.count() == 0 and AuditEvent.objects.count() == 0


def test_the_database_refuses_unknown_or_no_scopes() -> None:
    from django.db import IntegrityError, transaction

    row, _ = new_key("worker")
    for bad in (["root"], [], "worker", {"0": "worker"}):
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKey.objects.filter(pk=row.pk).update(scopes=bad)


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Basic dXNlcjpwdw==", "kk_0123abcd_" + "x" * 43, "Bearer not-a-key", "Bearer a\x00b"],
)
def test_missing_or_malformed_keys_are_401(header: str | None) -> None:
    refused = refusal(header)
    assert (refused.status, refused.code) == (401, "unauthorized")
    assert refused.message and "\n" not in refused.message
    assert refused.response()["WWW-Authenticate"].startswith("Bearer")


def test_unknown_key_and_wrong_secret_are_401() -> None:
    row, _raw = new_key("worker")
    assert refusal("Bearer kk_0123abcd_" + "A" * 43).message == "unknown API key"
    assert refusal(f"Bearer kk_{row.prefix}_" + "A" * 43).message == "unknown API key"  # a real prefix, a guessed secret


def test_expired_key_is_401_even_while_cached() -> None:
    row, raw = new_key("worker", expires_at=timezone.now() + timedelta(hours=1))
    authenticate(f"Bearer {raw}")  # cached now
    ApiKey.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert authenticate(f"Bearer {raw}").key_id == row.pk, "the cache holds it until its lifetime ends"
    # The cached expiry is checked on every call: a key that expires while cached is refused.
    forget_cached()
    _expiring, raw2 = new_key("worker", expires_at=timezone.now() + timedelta(hours=1))
    authenticate(f"Bearer {raw2}")
    keys._cache[keys.hash_key(raw2)].expires_at = timezone.now() - timedelta(seconds=1)
    assert "expired" in refusal(f"Bearer {raw2}").message
    assert "expired" in refusal(f"Bearer {raw}").message  # from the database, the cache forgotten


@pytest.mark.django_db(transaction=True)
def test_revoked_key_is_refused_at_once_in_this_process_and_announced(redis_clean: None) -> None:
    row, raw = new_key("worker")
    authenticate(f"Bearer {raw}")  # cached
    listener = doorbell.redis_connection().pubsub()
    listener.subscribe(keys.revoked_channel())
    listener.get_message(timeout=2)  # the subscribe confirmation
    revoke_key(key_id=row.pk, actor="ops")
    refused = refusal(f"Bearer {raw}")
    assert (refused.status, refused.message) == (401, f"API key kk_{row.prefix} was revoked")
    message = listener.get_message(timeout=5)
    assert message is not None and message["data"] == row.prefix.encode()
    listener.close()
    event = AuditEvent.objects.get(action=AuditAction.API_KEY_REVOKED)
    assert (event.actor, event.target_id) == ("ops", row.prefix)
    with pytest.raises(keys.ApiKeyError, match="already revoked by ops"):
        revoke_key(key_id=row.pk, actor="ops")
    assert AuditEvent.objects.filter(action=AuditAction.API_KEY_REVOKED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_revoke_works_when_redis_is_down(settings: object) -> None:
    row, raw = new_key("worker")
    authenticate(f"Bearer {raw}")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    doorbell.reset_connection()
    try:
        revoke_key(key_id=row.pk, actor="ops")  # the announcement fails after commit: logged, not raised
    finally:
        doorbell.reset_connection()  # the settings fixture restores REDIS_URL
    assert ApiKey.objects.get(pk=row.pk).revoked_at is not None
    assert refusal(f"Bearer {raw}").status == 401


def test_a_revoke_elsewhere_reaches_the_cache_within_its_lifetime(settings: object) -> None:
    """Another process's revoke, without Redis: the next check of the cached keys drops it."""
    row, raw = new_key("worker")
    authenticate(f"Bearer {raw}")
    ApiKey.objects.filter(pk=row.pk).update(revoked_at=timezone.now(), revoked_by="elsewhere")
    assert authenticate(f"Bearer {raw}").key_id == row.pk
    settings.KOALA_API_KEY_CACHE_SECONDS = 0  # the lifetime has passed
    assert "revoked" in refusal(f"Bearer {raw}").message


def test_a_persons_key_stops_when_the_person_is_deactivated(settings: object) -> None:
    user = get_user_model().objects.create_user("alice")
    _row, raw = new_key("execute", person="alice")
    assert authenticate(f"Bearer {raw}").person == "alice"
    user.is_active = False
    user.save()
    settings.KOALA_API_KEY_CACHE_SECONDS = 0
    assert "inactive" in refusal(f"Bearer {raw}").message


@pytest.mark.parametrize(
    ("scopes", "needed", "allowed"),
    [
        (("worker",), KeyScope.WORKER, True),
        (("execute",), KeyScope.WORKER, False),
        (("write",), KeyScope.WORKER, True),
        (("admin",), KeyScope.WORKER, True),
        (("execute",), KeyScope.EXECUTE, True),
        (("worker",), KeyScope.EXECUTE, False),
        (("write",), KeyScope.EXECUTE, True),
        (("admin",), KeyScope.EXECUTE, True),
    ],
)
def test_scopes_and_their_fallbacks(scopes: tuple[str, ...], needed: KeyScope, allowed: bool) -> None:
    _, raw = new_key(*scopes)
    principal = authenticate(f"Bearer {raw}")
    if allowed:
        require(principal, needed)
        return
    with pytest.raises(ApiError) as caught:
        require(principal, needed)
    other = "execute" if needed == KeyScope.WORKER else "worker"
    assert (caught.value.status, caught.value.code) == (403, "forbidden")
    assert caught.value.message == (
        f"this call needs a key with the '{needed}' scope (or 'write' or 'admin'); this key has: {other}"
    )


def test_a_fleet_costs_no_queries_once_its_keys_are_cached() -> None:
    fleet = [new_key("worker", name=f"w{n}")[1] for n in range(20)]
    for raw in fleet:
        authenticate(f"Bearer {raw}")
    with CaptureQueriesContext(connection) as queries:
        for _ in range(10):
            for raw in fleet:
                authenticate(f"Bearer {raw}")
    assert len(queries) == 0, [q["sql"] for q in queries]


def test_recheck_of_the_cached_keys_is_one_query(settings: object) -> None:
    fleet = [new_key("worker", name=f"w{n}")[1] for n in range(20)]
    for raw in fleet:
        authenticate(f"Bearer {raw}")
    settings.KOALA_API_KEY_CACHE_SECONDS = 0
    with CaptureQueriesContext(connection) as queries:
        authenticate(f"Bearer {fleet[0]}")
    assert len(queries) == 1


def test_last_used_is_written_at_most_once_a_minute() -> None:
    row, raw = new_key("worker")
    assert ApiKey.objects.get(pk=row.pk).last_used_at is None
    authenticate(f"Bearer {raw}")
    first = ApiKey.objects.get(pk=row.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        for _ in range(50):
            authenticate(f"Bearer {raw}")
    assert len(queries) == 0 and ApiKey.objects.get(pk=row.pk).last_used_at == first
    # Another process (a fresh cache) within the minute: its conditional UPDATE changes nothing.
    forget_cached()
    authenticate(f"Bearer {raw}")
    assert ApiKey.objects.get(pk=row.pk).last_used_at == first
    # A minute later it moves.
    old = timezone.now() - timedelta(seconds=61)
    ApiKey.objects.filter(pk=row.pk).update(last_used_at=old)
    forget_cached()
    authenticate(f"Bearer {raw}")
    assert ApiKey.objects.get(pk=row.pk).last_used_at > old  # type: ignore[operator]


def test_a_key_is_not_a_login() -> None:
    get_user_model().objects.create_superuser("root", "r@example.com", "pw-for-tests-only")
    _, raw = new_key("admin", person="root")
    client = Client()
    page = client.get("/admin/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert page.status_code == 302 and "/login/" in page["Location"]
    login = client.post("/admin/login/", {"username": "root", "password": raw, "next": "/admin/"})
    assert login.status_code == 200 and "_auth_user_id" not in client.session


# -- the admin ---------------------------------------------------------------------------------


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("ops", "ops@example.com", "pw-for-tests-only"))
    return client


def test_admin_creates_a_key_and_shows_it_once(superuser_client: Client) -> None:
    get_user_model().objects.create_user("alice")
    alice = get_user_model().objects.get(username="alice")
    page = superuser_client.post(
        "/admin/api/apikey/add/",
        {"name": "alice's scripts", "scopes": ["execute"], "person": str(alice.pk), "expires_in_days": "30"},
        follow=True,
    )
    assert page.status_code == 200
    row = ApiKey.objects.get()
    shown = [str(m) for m in page.context["messages"]]
    raw = next(m.rsplit(" ", 1)[1] for m in shown if "not shown again" in m)
    assert raw.startswith(f"kk_{row.prefix}_") and row.secret_hash == keys.hash_key(raw)
    assert (row.person, row.scopes, row.created_by) == (alice, ["execute"], "ops")
    assert row.expires_at is not None and row.expires_at > timezone.now() + timedelta(days=29)
    assert AuditEvent.objects.filter(action=AuditAction.API_KEY_CREATED, actor="ops").count() == 1
    listing = superuser_client.get("/admin/api/apikey/")
    assert row.prefix in listing.content.decode() and raw not in listing.content.decode()
    detail = superuser_client.get(f"/admin/api/apikey/{row.pk}/change/")
    assert detail.status_code == 200 and raw.split("_", 2)[2] not in detail.content.decode()


def test_admin_form_refuses_bad_input_and_changes_nothing(superuser_client: Client) -> None:
    page = superuser_client.post("/admin/api/apikey/add/", {"name": "x", "scopes": ["root"]})
    assert page.status_code == 200 and "scopes" in page.context["adminform"].form.errors
    page = superuser_client.post("/admin/api/apikey/add/", {"name": "", "scopes": ["worker"]})
    assert "name" in page.context["adminform"].form.errors
    assert ApiKey.objects.count() == 0 and AuditEvent.objects.count() == 0


def test_admin_revoke_action(superuser_client: Client, django_capture_on_commit_callbacks: object) -> None:
    row, raw = new_key("worker")
    authenticate(f"Bearer {raw}")
    with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
        superuser_client.post("/admin/api/apikey/", {"action": "revoke_keys", "_selected_action": [str(row.pk)]})
    assert ApiKey.objects.get(pk=row.pk).revoked_by == "ops"
    assert AuditEvent.objects.filter(action=AuditAction.API_KEY_REVOKED, actor="ops").count() == 1
    assert refusal(f"Bearer {raw}").status == 401
    page = superuser_client.post("/admin/api/apikey/", {"action": "revoke_keys", "_selected_action": [str(row.pk)]}, follow=True)
    assert any("already revoked" in str(m) for m in page.context["messages"])
    assert AuditEvent.objects.filter(action=AuditAction.API_KEY_REVOKED).count() == 1


def test_admin_key_pages_are_for_superusers_only() -> None:
    staff = get_user_model().objects.create_user("viewer", password="x", is_staff=True)
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="workers"))
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/api/apikey/").status_code == 403
    assert client.get("/admin/api/apikey/add/").status_code == 403
    assert "apikey" not in client.get("/admin/").content.decode().lower()
    staff.user_permissions.add(Permission.objects.get(codename="manage_keys"))
    client.force_login(get_user_model().objects.get(pk=staff.pk))
    assert client.get("/admin/api/apikey/").status_code == 200
