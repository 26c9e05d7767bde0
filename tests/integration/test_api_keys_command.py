"""koala_apikey: create prints the raw key once (its last line), list never shows it, revoke is audited."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from api.keys import authenticate, forget_cached, hash_key
from api.models import ApiKey
from koala.audit import AuditAction
from koala.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)  # revoke announces after commit


def run(*args: str) -> str:
    out = StringIO()
    call_command("koala_apikey", *args, stdout=out)
    return out.getvalue()


def test_create_list_revoke(redis_clean: None) -> None:
    forget_cached()
    get_user_model().objects.create_user("alice")
    printed = run(
        "create",
        "--name",
        "alice's",
        "--scope",
        "execute",
        "--scope",
        "worker",
        "--person",
        "alice",
        "--expires-in-days",
        "7",
        "--actor",
        "ops",
    )
    raw = printed.strip().splitlines()[-1]
    row = ApiKey.objects.get()
    assert raw.startswith(f"kk_{row.prefix}_") and f"kk_{row.prefix}" in printed.splitlines()[0]
    assert row.secret_hash == hash_key(raw) and row.scopes == ["worker", "execute"] and row.person is not None
    assert authenticate(f"Bearer {raw}").person == "alice"
    listed = run("list")
    assert f"kk_{row.prefix}" in listed and raw.split("_", 2)[2] not in listed and "person=alice" in listed
    assert run("revoke", f"kk_{row.prefix}", "--actor", "ops").startswith(f"revoked key kk_{row.prefix}")
    assert [
        e.actor for e in AuditEvent.objects.filter(action__in=[AuditAction.API_KEY_CREATED, AuditAction.API_KEY_REVOKED])
    ] == [
        "ops",
        "ops",
    ]
    with pytest.raises(Exception, match="revoked"):
        authenticate(f"Bearer {raw}")
    with pytest.raises(CommandError, match="already revoked"):
        run("revoke", row.prefix, "--actor", "ops")
    assert "revoked" in run("list")
