"""Template helpers for the console and the admin: the pause banner and number formats."""

from __future__ import annotations

import json
from typing import Any

from django import template
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


@register.filter
def retry_refusal(kind: str) -> str:
    """Why jobs of this kind are not offered Retry in the console ("" when they are)."""
    return _retry_refusal(kind=kind)
