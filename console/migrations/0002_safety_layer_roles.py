"""The roles read the safety layer's records in the Django admin too; operators may edit
budgets and model prices there (the admin saves them through the audited services)."""

from django.db import migrations

READ_MODELS = [
    ("workers", "operation"),
    ("workers", "budget"),
    ("workers", "budgetusage"),
    ("workers", "modelprice"),
    ("workers", "pause"),
    ("reviews", "reviewrequest"),
]
OPERATOR_EDITS = [("workers", "budget", "add"), ("workers", "budget", "change"), ("workers", "modelprice", "add"), ("workers", "modelprice", "change")]


def _permission(apps, app_label, model, action):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    model_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
    perm, _ = Permission.objects.get_or_create(
        content_type=model_type, codename=f"{action}_{model}", defaults={"name": f"Can {action} {model}"}
    )
    return perm


def grant(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    reads = [_permission(apps, app_label, model, "view") for app_label, model in READ_MODELS]
    for name in ("operators", "reviewers", "auditors"):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*reads)
    Group.objects.get(name="operators").permissions.add(*[_permission(apps, *edit) for edit in OPERATOR_EDITS])


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    models = [model for _, model in READ_MODELS]
    for group in Group.objects.filter(name__in=["operators", "reviewers", "auditors"]):
        group.permissions.remove(*Permission.objects.filter(content_type__model__in=models))


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_roles"),
        ("workers", "0002_safety_layer"),
        ("reviews", "0001_initial"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
