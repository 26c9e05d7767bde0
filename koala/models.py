from __future__ import annotations

from django.db import models


class AuditEvent(models.Model):
    """Who did what: operator actions and people reading run data, never the worker's machine loop.

    Written by services in the same transaction as the change it records.
    """

    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.target_type}:{self.target_id}"
