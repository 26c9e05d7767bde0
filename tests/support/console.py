"""Fixtures for the console tests: one staff user per role and logged-in clients (imported into
tests/conftest.py, so every tier sees them; the browser set-up is tests/browser/conftest.py)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.test import Client

PASSWORD = "console-test-password-9f3a"  # test users only
ROLES = ("operators", "reviewers", "auditors")


def make_user(username: str, *groups: str, staff: bool = True) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=staff)
    user.groups.add(*Group.objects.filter(name__in=groups))
    return user


def ensure_roles() -> None:
    """Re-run the roles migrations' own code: a transactional test's flush empties auth_group."""
    importlib.import_module("console.migrations.0001_roles").create_roles(apps, None)
    importlib.import_module("console.migrations.0002_safety_layer_roles").grant(apps, None)
    importlib.import_module("console.migrations.0003_exports_read_roles").grant(apps, None)
    importlib.import_module("console.migrations.0004_workflow_roles").grant(apps, None)


@pytest.fixture
def role_users(db: None, settings: Any) -> dict[str, User]:
    """operator, reviewer, auditor (one group each), and a staff user with no role. Committed
    or not as the test's own django_db mark says (``db`` follows the mark)."""
    # A real but fast hasher for these test-only passwords (the default costs ~0.3 s a user);
    # the browser tests still log in through the login form with them.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    ensure_roles()
    return {
        "operator": make_user("olga", "operators"),
        "reviewer": make_user("rita", "reviewers"),
        "auditor": make_user("aude", "auditors"),
        "norole": make_user("nora"),
    }


@pytest.fixture
def reviewers(db: None) -> dict[str, User]:
    """alice and bob in the reviewers group, as in the demo: a review is decided only by a
    reviewer (reviews.services checks it), so tests that decide one name these. Adds the group
    to users of those names another fixture made (``people``)."""
    ensure_roles()
    group = Group.objects.get(name="reviewers")
    found = {}
    for name in ("alice", "bob"):
        user, _ = User.objects.get_or_create(username=name, defaults={"email": f"{name}@example.com"})
        user.groups.add(group)
        found[name] = user
    return found


@pytest.fixture
def clients(role_users: dict[str, User]) -> dict[str, Client]:
    logged_in = {}
    for role, user in role_users.items():
        client = Client()
        client.force_login(user)
        logged_in[role] = client
    logged_in["anonymous"] = Client()
    return logged_in
