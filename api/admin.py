"""API keys in the admin: list, create (the raw key is shown once, in a message), revoke.

For superusers, or whoever holds ``api.manage_keys`` (as django-rq's pages, workers/rq_pages.py):
a key is a credential, so no console role sees these pages. Every change goes through
``api.keys`` (validated, audited); a key is never edited or deleted, only revoked.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from api.keys import ApiKeyError, KeyScope, checked_kinds, create_key, revoke_key
from api.models import ApiKey
from workers import targets

PERMISSION = "api.manage_keys"


def may_manage_keys(user: Any) -> bool:
    return bool(user.is_active and user.is_staff and user.has_perm(PERMISSION))


class ApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(s.value, s.value) for s in KeyScope],
        widget=forms.CheckboxSelectMultiple,
        help_text="worker: the worker protocol; execute: start, read, cancel jobs; write and admin: both.",
    )
    person = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True),
        required=False,
        help_text="Leave empty for a machine key. A person's key is audited as that person when it reads run data.",
    )
    expires_in_days = forms.IntegerField(min_value=1, max_value=3660, required=False, help_text="Empty: never expires.")
    kinds = forms.CharField(
        required=False,
        max_length=2000,
        help_text="The job kinds it may serve, start and read: name (any version) or name@version, comma-separated. Empty: any.",
    )
    queues = forms.MultipleChoiceField(
        choices=lambda: [(q, q) for q in targets.configured_queues()],
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="The queues it may serve and start jobs on. None ticked: any.",
    )

    class Meta:
        model = ApiKey
        fields = ["name"]

    def clean_kinds(self) -> list[str]:
        text = self.cleaned_data.get("kinds") or ""
        items = [item.strip() for item in text.split(",")] if text.strip() else []
        if any(not item for item in items):
            raise forms.ValidationError("An empty kind name: separate names with single commas.")
        try:
            return checked_kinds(items)
        except ApiKeyError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = [
        "prefix",
        "name",
        "shown_scopes",
        "shown_kinds",
        "shown_queues",
        "person",
        "created_by",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "person__username"]
    list_select_related = ["person"]
    actions = ["revoke_keys"]
    readonly_fields = [
        "prefix",
        "shown_scopes",
        "shown_kinds",
        "shown_queues",
        "person",
        "created_by",
        "created_at",
        "expires_at",
        "revoked_at",
        "revoked_by",
        "last_used_at",
    ]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["name", "scopes", "kinds", "queues", "person", "expires_in_days"]
        return ["name", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["name", *self.readonly_fields] if obj is not None else []

    @admin.display(description="scopes")
    def shown_scopes(self, obj: ApiKey) -> str:
        return ", ".join(obj.scopes)

    @admin.display(description="kinds")
    def shown_kinds(self, obj: ApiKey) -> str:
        return ", ".join(obj.kinds) or "any"

    @admin.display(description="queues")
    def shown_queues(self, obj: ApiKey) -> str:
        return ", ".join(obj.queues) or "any"

    def has_module_permission(self, request: HttpRequest) -> bool:
        return may_manage_keys(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_manage_keys(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return may_manage_keys(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # never edited: revoke and create another

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked keys stay, for the audit log's prefixes

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return may_manage_keys(request.user)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        data = form.cleaned_data
        days = data.get("expires_in_days")
        person = data.get("person")
        try:
            row, raw = create_key(
                name=data["name"],
                scopes=data["scopes"],
                actor=request.user.get_username(),
                person=person.get_username() if person is not None else "",
                expires_at=timezone.now() + timedelta(days=days) if days else None,
                kinds=data.get("kinds") or [],
                queues=data.get("queues") or [],
            )
        except ApiKeyError as exc:
            # The form checked all of it; a race (the person deactivated meanwhile) lands here.
            raise forms.ValidationError(str(exc)) from None
        obj.pk = row.pk
        obj.prefix = row.prefix
        # Shown once, here: Koala keeps only its hash.
        messages.warning(request, f"API key kk_{row.prefix} created. Copy it now; it is not shown again: {raw}")

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        done, errors = 0, []
        for key in queryset:
            try:
                revoke_key(key_id=key.pk, actor=request.user.get_username())
                done += 1
            except ApiKeyError as exc:
                errors.append(str(exc))
        if done:
            self.message_user(request, f"Revoked {done} key(s).", messages.SUCCESS)
        for error in errors[:10]:
            self.message_user(request, error, messages.WARNING)
