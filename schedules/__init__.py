"""Schedules: cron or interval slots materialised into jobs, exactly one per slot (docs/schedules.md)."""
