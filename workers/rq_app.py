"""django-rq's app, named as people read it.

Its label is ``django_rq``, which the admin would show as "Django_Rq" (permission lists, the app
list, breadcrumbs) beside its own "Django-RQ" pages. INSTALLED_APPS names this config instead of
``django_rq``; the label, its tables and its permission stay django-rq's.
"""

from __future__ import annotations

from django_rq.apps import DjangoRqAdminConfig


class DjangoRQConfig(DjangoRqAdminConfig):
    verbose_name = "Django-RQ"
