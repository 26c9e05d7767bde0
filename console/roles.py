"""Who may do what in the console, checked on the server for every request.

Roles are Django groups created by ``console/migrations/0001_roles.py``; each carries
permissions of the table-less ``console.Console`` model. Superusers hold every permission.

| group | may |
| --- | --- |
| operators | view; pause/resume; retry/cancel/requeue (one or in bulk); cancel exports (of their |
|           | accounts); resolve uncertain operations; edit budgets and prices; start, cancel and |
|           | move workflow runs; send signals to runs |
| reviewers | view; approve/reject review requests; send signals to runs |
| auditors | view only |
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_http_methods

from reviews.services import REVIEW_PERMISSION

OPERATORS, REVIEWERS, AUDITORS = "operators", "reviewers", "auditors"

VIEW = "console.view_operations"
OPERATE = "console.operate"
REVIEW = REVIEW_PERMISSION  # reviews.services decides who may review with the same permission
RUN_WORKFLOWS = "console.run_workflows"  # start, cancel, move a stranded run to another version
SIGNAL_RUNS = "console.signal_runs"  # send a signal to a run (a reviewer's approval is one)

View = Callable[..., HttpResponse]


def page(permission: str, *, methods: tuple[str, ...] = ("GET",)) -> Callable[[View], View]:
    """Wrap a console view: staff login (the admin's), then ``permission``, then the HTTP method.

    The admin wrapper sends anonymous and non-staff users to the admin login and marks the
    response never-cache; a logged-in staff user without the permission gets 403, so a role
    never learns more than "not yours" about another role's pages.
    """

    def decorate(view: View) -> View:
        allowed = require_http_methods(list(methods))(view)

        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            # The permission comes before the method check: another role gets 403 whatever it sends.
            if not request.user.has_perm(permission):
                raise PermissionDenied(f"Your roles do not include {permission.split('.')[-1].replace('_', ' ')}.")
            return allowed(request, *args, **kwargs)

        return admin.site.admin_view(checked)

    return decorate


def actor(request: HttpRequest) -> str:
    """The name services write into audit rows and decisions."""
    return request.user.get_username()


def can(request: HttpRequest, permission: str) -> bool:
    return bool(request.user.has_perm(permission))
