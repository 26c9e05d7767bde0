"""/api/v1/: the worker protocol (docs/worker-api.md), the job calls, and the OpenAPI document."""

from django.urls import include, path, re_path

from api.views import spec, worker

app_name = "api"

urlpatterns = [
    path("workers/register", worker.register, name="register"),
    path("workers/<str:worker_id>/acquire", worker.acquire, name="acquire"),
    path("workers/<str:worker_id>/stop", worker.stop, name="stop"),
    path("leases/<int:lease_id>/heartbeat", worker.heartbeat, name="heartbeat"),
    path("leases/<int:lease_id>/complete", worker.complete, name="complete"),
    path("leases/<int:lease_id>/fail", worker.fail, name="fail"),
    path("leases/<int:lease_id>/operations", worker.begin_operation, name="begin-operation"),
    path("leases/<int:lease_id>/operations/<int:operation_id>", worker.settle_operation, name="settle-operation"),
    path("openapi.json", spec.openapi, name="openapi"),
    path("", include("api.run_urls")),
    # Last: any other path under /api/v1/ answers the API's JSON 404, not Django's HTML page.
    re_path(r"^(?P<rest>.*)$", spec.not_found, name="not-found"),
]
