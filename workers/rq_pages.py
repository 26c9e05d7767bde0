"""django-rq's pages, mounted by Koala at /admin/django-rq/ (koala/urls.py).

RQ holds only doorbells (PostgreSQL holds the jobs), and django-rq's pages can empty queues,
delete and requeue messages: they are for superusers (or whoever holds django-rq's own
``django_rq.admin`` permission), never for a console role. Koala mounts them once, here,
instead of django-rq's admin entry (``RQ_SHOW_ADMIN_LINK = False``), and the admin index links
here for the people allowed in.

Two of django-rq's pages answer 500 on their own, and Koala's mount fixes both:

- the worker page takes the worker's Redis key, but django-rq's own breadcrumb links to it by
  the worker's bare name (``ValueError: Not a valid RQ worker key``); a worker that stopped
  between the list and the click fails an ``assert``. Here it takes a name or a key and
  answers 404 for a worker Redis does not know.
- a queue index beyond the configured queues raised IndexError: 404 here.

Worker names themselves are kept linkable by ``workers.rq_workers.check_worker_name``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django_rq import views as rq_views
from django_rq.queues import get_queue_by_index
from django_rq.settings import get_queues_list
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns
from rq.worker import Worker

PERMISSION = "django_rq.admin"  # django-rq's own ("Access admin page"); superusers hold it
# Indexes into the configured queues (django-rq raises IndexError beyond them); its cron pages check their own.
INDEX_ARGUMENTS = ("queue_index", "scheduler_index")

View = Callable[..., HttpResponse]


def may_see_rq_pages(user: Any) -> bool:
    return bool(user.is_active and user.is_staff and user.has_perm(PERMISSION))


def guarded(view: View) -> View:
    """The admin's login, then the permission, then a queue index that names a configured queue."""

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not may_see_rq_pages(request.user):
            raise PermissionDenied("django-rq's pages are for superusers.")
        for name in INDEX_ARGUMENTS:
            if name in kwargs and not 0 <= int(kwargs[name]) < len(get_queues_list()):
                raise Http404(f"no queue number {kwargs[name]}")
        return view(request, *args, **kwargs)

    return admin.site.admin_view(checked)


def worker_details(request: HttpRequest, queue_index: int, key: str) -> HttpResponse:
    """django-rq's worker page, for a worker named by its Redis key or by its name."""
    prefix = Worker.redis_worker_namespace_prefix
    if not key.startswith(prefix):
        key = prefix + key  # django-rq's breadcrumb links by name
    # Ask first: django-rq asserts the worker exists, and one that stopped since the list was
    # drawn (or a stale bookmark) is a page that is gone, not a server error.
    if not get_queue_by_index(queue_index).connection.exists(key):
        raise Http404("no such worker is registered in Redis (it may have stopped)")
    return rq_views.worker_details(request, queue_index, key)


def _pages() -> list[URLPattern]:
    pages = []
    for pattern in get_admin_urlpatterns(view_wrapper=guarded):
        if pattern.name == "worker_details":
            pattern = path("workers/<int:queue_index>/<str:key>/", guarded(worker_details), name="worker_details")
        pages.append(pattern)
    # The JSON statistics keep django-rq's own authentication (an API token or a staff session).
    return get_api_urlpatterns() + pages


# include((urlpatterns, "django_rq")): django-rq's templates reverse "django_rq:<name>".
urlpatterns = _pages()
