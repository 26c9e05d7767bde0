from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

admin.site.site_header = "Koala"
admin.site.site_title = "Koala admin"
admin.site.index_title = "Jobs, workers and reviews"
# "View site" in the admin's header leads to the operations dashboard, the staff landing page.
admin.site.site_url = "/admin/console/"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="console:dashboard", permanent=False)),
    # django-rq's pages, as Koala mounts them (superusers; a worker page that works): workers/rq_pages.py.
    path("admin/django-rq/", include(("workers.rq_pages", "django_rq"))),
    # Before admin.site.urls, whose catch-all would otherwise answer these paths.
    path("admin/console/reviews/", include("console.review_urls")),
    path("admin/console/", include("console.urls")),
    path("admin/", admin.site.urls),
    path("exports/", include("exports.urls")),
    # The HTTP API: the worker protocol and the job calls, behind scoped keys (docs/worker-api.md).
    path("api/v1/", include("api.urls")),
    # /healthz and /readyz: unauthenticated probes, one word per check (workers/health.py).
    path("", include("workers.health")),
    # GET /metrics: Prometheus' text format, behind a bearer token or loopback (docs/metrics.md).
    path("", include("metrics.urls")),
]
