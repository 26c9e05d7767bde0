"""The roles come from a migration: a fresh database has the three groups and their permissions.

Not transactional on purpose: pytest-django runs these before any transactional test, whose
flush would empty auth_group, so this sees exactly what `migrate` left."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

pytestmark = pytest.mark.django_db


def codenames(group: str, app_label: str) -> set[str]:
    return set(Permission.objects.filter(group__name=group, content_type__app_label=app_label).values_list("codename", flat=True))


def test_migrate_creates_operators_reviewers_and_auditors() -> None:
    # Workflows (console 0004): operators start, cancel and move runs; operators and reviewers signal them.
    assert codenames("operators", "console") == {"view_operations", "operate", "run_workflows", "signal_runs"}
    assert codenames("reviewers", "console") == {"view_operations", "review", "signal_runs"}
    assert codenames("auditors", "console") == {"view_operations"}
    # Every role reads the engine's records in the admin (read-only there).
    for group in ("operators", "reviewers", "auditors"):
        assert {"view_job", "view_attempt", "view_workerprocess"} <= codenames(group, "workers")
        assert "view_auditevent" in codenames(group, "koala")
    assert set(Group.objects.values_list("name", flat=True)) >= {"operators", "reviewers", "auditors"}


def test_roles_read_the_safety_layer_and_only_operators_edit_budgets_and_prices() -> None:
    for group in ("operators", "reviewers", "auditors"):
        assert {"view_operation", "view_budget", "view_budgetusage", "view_modelprice", "view_pause"} <= codenames(
            group, "workers"
        )
        assert "view_reviewrequest" in codenames(group, "reviews")
    assert {"add_budget", "change_budget", "add_modelprice", "change_modelprice"} <= codenames("operators", "workers")
    for group in ("reviewers", "auditors"):
        assert not {"add_budget", "change_budget", "change_modelprice"} & codenames(group, "workers")


def test_roles_read_exports_and_accounts_but_not_events_and_the_grant_reverses() -> None:
    from django.core.management import call_command

    for group in ("operators", "reviewers", "auditors"):
        assert codenames(group, "exports") == {"view_export", "view_account"}, group
    call_command("migrate", "console", "0002_safety_layer_roles", verbosity=0)
    for group in ("operators", "reviewers", "auditors"):
        assert codenames(group, "exports") == set(), group
        assert "view_operations" in codenames(group, "console"), "reversing 0003 leaves the older grants alone"
        assert "view_reviewrequest" in codenames(group, "reviews")
    call_command("migrate", "console", verbosity=0)
    for group in ("operators", "reviewers", "auditors"):
        assert codenames(group, "exports") == {"view_export", "view_account"}, group
