"""The execute calls' routes (jobs and workflow runs); the API's URLconf includes them under /api/v1/."""

from __future__ import annotations

from django.urls import path

from api.views import flows, runs

urlpatterns = [
    path("jobs", runs.start_job, name="api-start-job"),
    path("jobs/<int:job_id>", runs.read_job, name="api-read-job"),
    path("jobs/<int:job_id>/cancel", runs.cancel, name="api-cancel-job"),
    path("runs", flows.start_run, name="api-start-run"),
    path("runs/<int:run_id>", flows.read_run, name="api-read-run"),
    path("runs/<int:run_id>/signals", flows.signal_run, name="api-signal-run"),
    path("runs/<int:run_id>/cancel", flows.cancel_run, name="api-cancel-run"),
]
