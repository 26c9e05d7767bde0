"""API keys (R19): scoped, hashed, expiring and revocable. The raw key is shown once, never stored."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Func, Q
from django.db.models.lookups import Exact

# The scopes a key may carry (api.keys.KeyScope has the same values and their meaning).
SCOPES = ("worker", "execute", "write", "admin")


def _is_array(field: str) -> Q:
    return Q(Exact(Func(F(field), function="jsonb_typeof", output_field=models.CharField()), "array"))


class ApiKey(models.Model):
    """One key. ``prefix`` is public (shown in lists, logs and audit rows); ``secret_hash`` is the
    sha256 of the whole raw key, so a leaked table gives no usable key."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField()  # a list of SCOPES, at least one (checked by the database too)
    # What the key may serve, start and read (api.keys.Principal.allows): job kinds as "name" (any
    # version) or "name@version", and queues. Empty: any. Fixed at creation, like the scopes.
    kinds = models.JSONField(default=list, blank=True)
    queues = models.JSONField(default=list, blank=True)
    # Blank: a machine key. Set: the key acts for this person (their reads of run data are audited).
    person = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys")
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True, default="")
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        default_permissions = ()
        # Like django-rq's pages (workers/rq_pages.py): superusers hold it, a console role does not.
        permissions = [("manage_keys", "Create, list and revoke API keys")]
        constraints = [
            models.CheckConstraint(
                # A JSON array (a lone string would pass <@), not empty, of known scopes only.
                condition=Q(Exact(Func(F("scopes"), function="jsonb_typeof", output_field=models.CharField()), "array"))
                & Q(scopes__contained_by=list(SCOPES))
                & ~Q(scopes=[]),
                name="api_apikey_scopes_known",
            ),
            models.CheckConstraint(
                condition=Q(revoked_at__isnull=True) | ~Q(revoked_by=""),
                name="api_apikey_revoked_by_someone",
            ),
            # JSON arrays (a lone string would read as "any" nowhere and as a name everywhere).
            models.CheckConstraint(condition=_is_array("kinds") & _is_array("queues"), name="api_apikey_limits_are_lists"),
        ]

    def __str__(self) -> str:
        return f"kk_{self.prefix} ({self.name})"
