"""The console keeps no data. One table-less model carries its permissions, so the role
groups (operators, reviewers, auditors) can hold them like any Django permission and
``user.has_perm`` checks them on the server."""

from __future__ import annotations

from django.db import models


class Console(models.Model):
    class Meta:
        managed = False  # no table: a holder for permissions only
        default_permissions = ()
        permissions = [
            ("view_operations", "Can view the Koala console: dashboard, jobs, failures, reviews, budgets"),
            ("operate", "Can pause/resume, retry/cancel/requeue jobs, resolve operations and edit budgets"),
            ("review", "Can approve or reject review requests"),
            ("run_workflows", "Can start and cancel workflow runs and move stranded runs to another version"),
            ("signal_runs", "Can send signals to workflow runs"),
        ]

    def __str__(self) -> str:
        return "Koala console"
