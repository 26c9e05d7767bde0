"""The execute calls' routes; the API's URLconf includes them under /api/v1/."""

from __future__ import annotations

from django.urls import path

from api.views import runs

urlpatterns = [
    path("jobs", runs.start_job, name="api-start-job"),
    path("jobs/<int:job_id>", runs.read_job, name="api-read-job"),
    path("jobs/<int:job_id>/cancel", runs.cancel, name="api-cancel-job"),
]
