"""System checks guarding invariants the rest of the code assumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

PLACEHOLDER_SECRET = "insecure-dev-only-secret-key"  # noqa: S105 - the value this check refuses


@register(Tags.security, deploy=False)
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if settings.DEBUG:
        return []
    key = settings.SECRET_KEY
    if key == PLACEHOLDER_SECRET or len(key) < 32 or len(set(key)) < 5:
        return [
            Error(
                "SECRET_KEY is missing or weak while DEBUG is off.",
                hint="Set SECRET_KEY (or SECRET_KEY_FILE) to 50 random characters, "
                "e.g. `python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
                id="koala.E001",
            )
        ]
    return []


@register()
def check_utc(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    # Leases, backoff and schedules compare database now() with Python time;
    # both must be UTC-aware or an expiry can be off by hours.
    errors = []
    if not settings.USE_TZ:
        errors.append(Error("USE_TZ must be True.", id="koala.E002"))
    if settings.TIME_ZONE != "UTC":
        errors.append(Error("TIME_ZONE must be 'UTC'; show local times in views instead.", id="koala.E003"))
    return errors


@register()
def check_lease_timing(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if settings.KOALA_HEARTBEAT_SECONDS * 2 > settings.KOALA_LEASE_SECONDS:
        return [
            Error(
                "KOALA_HEARTBEAT_SECONDS should be at most half of KOALA_LEASE_SECONDS, "
                "so one late heartbeat does not lose the lease.",
                id="koala.E004",
            )
        ]
    return []


@register()
def check_session_bounds(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    # A stale attempt's transaction must end (idle-in-transaction) and every statement must give
    # up before the lease it runs under expires, or a partitioned worker can still hold locks
    # when its job is reclaimed (docs/guarantees.md).
    errors = []
    lease = settings.KOALA_LEASE_SECONDS
    for name in (
        "KOALA_DB_STATEMENT_TIMEOUT_SECONDS",
        "KOALA_DB_LOCK_TIMEOUT_SECONDS",
        "KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
    ):
        if getattr(settings, name) >= lease:
            errors.append(Error(f"{name} must be shorter than KOALA_LEASE_SECONDS ({lease:g}).", id="koala.E005"))
    return errors


@register(Tags.security, deploy=True)
def check_export_root_outside_the_code(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    # A deployment's code is read-only (deploy/systemd: ProtectSystem=strict): an exports folder
    # inside the checkout (the default, .koala-data/ there) makes every export fail when it writes.
    storage = settings.STORAGES.get("exports", {})
    if storage.get("BACKEND") != "django.core.files.storage.FileSystemStorage":
        return []
    location = Path(storage.get("OPTIONS", {}).get("location") or settings.MEDIA_ROOT).resolve()
    if location.is_relative_to(Path(settings.BASE_DIR).resolve()):
        return [
            Warning(
                f"The exports folder {location} is inside the code checkout, which a deployment keeps read-only.",
                hint="Set KOALA_DATA_DIR (or KOALA_EXPORT_ROOT) to a writable folder, e.g. /var/lib/koala "
                "(deploy/systemd/koala.env.example).",
                id="koala.W001",
            )
        ]
    return []
