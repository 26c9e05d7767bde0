"""Input parsing for the console's pages. Forms validate shape only; the services decide."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.conf import settings
from django.utils import timezone

from console.selectors.jobs import JobFilter
from console.services import ACTIONS
from flows.models import RunState
from workers import definitions, kinds
from workers.definitions import MAX_RUN_INPUT_BYTES, MAX_SIGNAL_PAYLOAD_BYTES
from workers.errors import JobStateError
from workers.models import FailureReason, JobState, ParkReason, PauseMode, Scope


def queue_choices() -> list[tuple[str, str]]:
    return [(q, q) for q in settings.RQ_QUEUES]


def kind_names() -> list[str]:
    return sorted({k.name for k in kinds.served()})


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "any state"), *JobState.choices])
    kind = forms.CharField(required=False, max_length=100)
    queue = forms.CharField(required=False, max_length=64)
    # "cause", not "reason": the bulk form posts the filter next to its own free-text reason.
    cause = forms.ChoiceField(
        required=False,
        label="reason",
        choices=[("", "any reason"), ("Failed", FailureReason.choices), ("Parked", ParkReason.choices)],
    )
    created_after = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    created_before = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    search = forms.CharField(required=False, max_length=200, label="id / key / trace")

    def to_filter(self) -> JobFilter:
        """The filter as given. An invalid one raises: it must never widen to "every job"."""
        if not self.is_valid():
            problems = "; ".join(f"{field}: {' '.join(str(e) for e in errors)}" for field, errors in self.errors.items())
            raise JobStateError(f"the filter is invalid ({problems}); nothing was selected.")
        data = self.cleaned_data
        return JobFilter(
            state=data.get("state") or "",
            kind=data.get("kind") or "",
            queue=data.get("queue") or "",
            reason=data.get("cause") or "",
            created_after=data.get("created_after"),
            created_before=data.get("created_before"),
            search=data.get("search") or "",
        )


class JobActionForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS])
    reason = forms.CharField(required=False, max_length=500)


class ExportCancelForm(forms.Form):
    reason = forms.CharField(required=False, max_length=500)


class ExportRequestForm(forms.Form):
    """An export request's shape. Who may export the account, the range's limits and the caps on
    rows are exports.services.request_export's to decide (the command line's rules too)."""

    account = forms.IntegerField(min_value=1, max_value=2**63 - 1)
    date_from = forms.DateField(label="from", input_formats=["%Y-%m-%d"])
    date_to = forms.DateField(label="to (inclusive)", input_formats=["%Y-%m-%d"])
    max_rows = forms.IntegerField(required=False, max_value=2**63 - 1, label="at most rows")


class BulkActionForm(JobActionForm):
    # Either the ticked rows or every job the (repeated) filter matches.
    scope = forms.ChoiceField(choices=[("selected", "selected"), ("all", "all matching")], initial="selected")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # The ids are whatever the page listed; the service re-checks each job's state.
        raw = self.data.getlist("ids") if hasattr(self.data, "getlist") else []
        if any(not (str(i).isascii() and str(i).isdigit()) for i in raw):  # "²" is a digit to isdigit()
            raise forms.ValidationError("Job ids are numbers.")
        cleaned["ids"] = [int(i) for i in raw]
        if cleaned.get("scope") == "selected" and not cleaned["ids"]:
            raise forms.ValidationError("Tick at least one job, or choose “all matching”.")
        return cleaned


class PauseForm(forms.Form):
    scope = forms.ChoiceField(choices=Scope.choices, initial=Scope.QUEUE)
    target = forms.CharField(required=False, max_length=100, help_text="Queue or kind name; empty for global.")
    # Not stripped: " acme" is refused by the service (targets.check_tenant), not quietly fixed.
    tenant = forms.CharField(
        required=False, max_length=100, strip=False, help_text="Only this tenant's jobs; empty for every tenant."
    )
    mode = forms.ChoiceField(choices=PauseMode.choices, initial=PauseMode.DRAIN, widget=forms.RadioSelect)
    reason = forms.CharField(max_length=500, widget=forms.TextInput(attrs={"size": 40}))
    expires_in_minutes = forms.IntegerField(required=False, min_value=1, max_value=60 * 24 * 30, label="Expires in (minutes)")
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        scope, target = cleaned.get("scope"), (cleaned.get("target") or "").strip()
        if scope == Scope.GLOBAL:
            target = ""
        elif not target:
            raise forms.ValidationError(f"Name the {scope} to pause.")
        cleaned["target"] = target
        return cleaned

    def expires_at(self) -> dt.datetime | None:
        minutes = self.cleaned_data.get("expires_in_minutes")
        return timezone.now() + dt.timedelta(minutes=minutes) if minutes else None


class ResumeForm(forms.Form):
    note = forms.CharField(required=False, max_length=500)


class ResolveForm(forms.Form):
    outcome = forms.ChoiceField(
        choices=[("happened", "It happened"), ("absent", "It did not happen (safe to re-send)")], widget=forms.RadioSelect
    )
    external_id = forms.CharField(required=False, max_length=200, label="External id (when it happened)")
    note = forms.CharField(max_length=1000, widget=forms.Textarea(attrs={"rows": 2, "cols": 50}))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("outcome") == "happened" and not (cleaned.get("external_id") or "").strip():
            raise forms.ValidationError("Give the provider's id of the effect that happened.")
        return cleaned


LIMIT_FIELDS = ("spend_limit_minor", "request_limit", "concurrency_limit", "run_seconds_limit", "attempt_limit")


class BudgetLimitsForm(forms.Form):
    spend_limit_minor = forms.IntegerField(required=False, min_value=0, label="Spend limit (minor units)")
    request_limit = forms.IntegerField(required=False, min_value=0)
    concurrency_limit = forms.IntegerField(required=False, min_value=0)
    run_seconds_limit = forms.IntegerField(required=False, min_value=0)
    attempt_limit = forms.IntegerField(required=False, min_value=0)
    pause_on_exhaust = forms.BooleanField(required=False)


class BudgetCreateForm(BudgetLimitsForm):
    name = forms.CharField(max_length=100)
    scope = forms.ChoiceField(choices=Scope.choices)
    target = forms.CharField(required=False, max_length=100)
    tenant = forms.CharField(required=False, max_length=100)
    timezone = forms.CharField(max_length=64, initial="UTC")

    field_order = ["name", "scope", "target", "tenant", "timezone", *LIMIT_FIELDS, "pause_on_exhaust"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A budget is in the cost currency (the one every cost is priced in): said, not asked.
        self.fields["spend_limit_minor"].label = f"Spend limit (minor units of {settings.KOALA_COST_CURRENCY})"

    def clean_timezone(self) -> str:
        value = self.cleaned_data["timezone"].strip()
        if value not in available_timezones():
            raise forms.ValidationError(f"{value!r} is not an IANA time zone (e.g. Europe/Paris).")
        return value


class PriceForm(forms.Form):
    model = forms.CharField(max_length=100)
    input_minor_per_mtok = forms.IntegerField(min_value=0, label="Input (minor units / 1M tokens)")
    output_minor_per_mtok = forms.IntegerField(min_value=0, label="Output (minor units / 1M tokens)")


# -- workflow runs (console/views/runs.py): shapes only; flows.services decides and names what is wrong --


class JSONObjectField(forms.CharField):
    """A JSON object typed into a text area ("" is {}): anything else is the field's own error."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 60, "spellcheck": "false"})

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value) or ""
        if not text.strip():
            return {}
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise forms.ValidationError(f"a JSON object ({{…}}), not a {type(parsed).__name__}")
        return parsed


def definition_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted({d.name for d in definitions.definitions()})]


class RunFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "any state"), *RunState.choices])
    definition = forms.CharField(required=False, max_length=60)
    before = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1, widget=forms.HiddenInput)


class StartRunForm(forms.Form):
    definition = forms.ChoiceField(choices=definition_choices)
    version = forms.IntegerField(required=False, min_value=1, max_value=2**31 - 1, help_text="empty: the newest")
    input = JSONObjectField(required=False, max_length=MAX_RUN_INPUT_BYTES * 2, label="input (a JSON object)")
    idempotency_key = forms.CharField(required=False, max_length=200, help_text="the same key and input start one run")


class SignalForm(forms.Form):
    name = forms.CharField(max_length=100)
    key = forms.CharField(max_length=200, help_text="deduplicates: the same key twice is one signal")
    payload = JSONObjectField(required=False, max_length=MAX_SIGNAL_PAYLOAD_BYTES * 2, label="payload (a JSON object)")


class CancelRunForm(forms.Form):
    reason = forms.CharField(required=False, max_length=500)
    confirm = forms.BooleanField(required=True, error_messages={"required": "Tick the box to confirm the cancel."})


class MoveRunForm(forms.Form):
    to_version = forms.IntegerField(min_value=1, max_value=2**31 - 1)
    confirm = forms.BooleanField(required=True, error_messages={"required": "Tick the box to confirm the move."})
