"""The roles read export records and accounts in the Django admin too (read-only there; the
console's Exports page needs only console.view_operations). Events are customer data: no role
gets them from here."""

from django.db import migrations

READ_MODELS = [("exports", "export"), ("exports", "account")]
ROLES = ("operators", "reviewers", "auditors")


def _view_permission(apps, app_label, model):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    model_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
    perm, _ = Permission.objects.get_or_create(
        content_type=model_type, codename=f"view_{model}", defaults={"name": f"Can view {model}"}
    )
    return perm


def grant(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    reads = [_view_permission(apps, app_label, model) for app_label, model in READ_MODELS]
    for name in ROLES:
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*reads)


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    reads = Permission.objects.filter(
        content_type__app_label="exports", codename__in=[f"view_{model}" for _, model in READ_MODELS]
    )
    for group in Group.objects.filter(name__in=ROLES):
        group.permissions.remove(*reads)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0002_safety_layer_roles"),
        ("exports", "0001_initial"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
