"""Placeholder until the keys branch lands: the job calls (POST/GET /api/v1/jobs…)."""

urlpatterns: list = []
