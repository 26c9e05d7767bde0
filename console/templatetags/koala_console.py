"""Template helpers for the console and the admin: the pause banner and number formats."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.conf import settings
from django.http import HttpRequest

from koala.redaction import redact_text
from workers.selectors.jobs import retry_refusal as _retry_refusal
from workers.services.pauses import active_pauses

register = template.Library()


@register.inclusion_tag("console/_pause_banner.html", takes_context=True)
def koala_pause_banner(context: template.Context) -> dict[str, Any]:
    """Every admin page says what is paused (R6): one indexed query on live pauses."""
    request: HttpRequest | None = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff or not user.has_perm("console.view_operations"):
        # Nothing about the system leaks to the login page, nor to staff without a console role
        # (the banner's link leads to the pause page, which refuses them).
        return {"pauses": []}
    return {"pauses": active_pauses(), "can_operate": user.has_perm("console.operate")}


@register.filter
def duration(seconds: float | None) -> str:
    """3725.4 -> "1h 2m 5s"; under a minute keeps one decimal."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s"


@register.filter
def minor(amount: int | None, currency: str = "") -> str:
    """Minor currency units as a decimal amount: 1234 -> "12.34"."""
    if amount is None:
        return "—"
    text = f"{amount / 100:,.2f}"
    return f"{text} {currency}".strip()


@register.filter
def cost(amount: int | None) -> str:
    """A cost in minor units of KOALA_COST_CURRENCY (operations, prices, spend): 1234 -> "12.34 EUR"."""
    return minor(amount, settings.KOALA_COST_CURRENCY)


@register.filter
def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


@register.filter
def share(used: float, limit: float | None) -> float:
    """How full a bar is, 0 to 100 (a missing limit draws no bar)."""
    if not limit:
        return 0.0
    return min(100.0, round(100 * float(used) / float(limit), 1))


@register.filter
def redacted(value: object) -> str:
    """Free text and identifiers (keys, targets, comments) pass the redaction layer again on
    the way out, so a credential-shaped value someone put in a key is masked on the page too."""
    return "" if value is None else redact_text(str(value), limit=2_000)


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON for <pre> blocks (autoescaped by the template like any other string)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


# Outcomes of an attempt that may have given its attempt back (parked, released on shutdown or
# for an unserved kind); an operator's requeue also ends a run "interrupted" but uses it.
GIVE_BACK = ("parked", "unservable", "interrupted")


@register.filter
def attempts_summary(record: Any) -> str:
    """ "2 of 5 used", and the runs listed that did not use one: "0 of 5 used · 1 more run gave
    its attempt back (parked)". Every run is a row in Attempts; only some count against the limit."""
    job = record.job
    line = f"{job.attempts} of {job.max_attempts} used"
    back = len(record.attempts) - job.attempts
    if back > 0:
        outcomes = [row.attempt.outcome for row in record.attempts]
        why = [o for o in GIVE_BACK if o in outcomes and (o != "interrupted" or back > sum(x in GIVE_BACK[:2] for x in outcomes))]
        runs = "1 more run gave its attempt back" if back == 1 else f"{back} more runs gave their attempts back"
        line += f" · {runs}" + (f" ({', '.join(why)})" if why else "")
    return line


@register.filter
def shown_error_class(job: Any) -> str:
    """A job's error class, except on a succeeded job: the engine keeps the last retry's error on
    the job row, but a job that succeeded has no error (its attempts keep theirs)."""
    return "" if job.state == "succeeded" else str(job.error_class or "")


@register.filter
def retry_refusal(kind: str) -> str:
    """Why jobs of this kind are not offered Retry in the console ("" when they are)."""
    return _retry_refusal(kind=kind)
