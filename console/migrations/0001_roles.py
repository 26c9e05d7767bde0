"""The console's permissions and the three role groups (operators, reviewers, auditors).

Created here rather than by hand so every installation has the same roles; the views check
the permissions on the server (console.roles).
"""

from django.db import migrations, models

CONSOLE_PERMISSIONS = {
    "view_operations": "Can view the Koala console: dashboard, jobs, failures, reviews, budgets",
    "operate": "Can pause/resume, retry/cancel/requeue jobs, resolve operations and edit budgets",
    "review": "Can approve or reject review requests",
}

# Every role reads the engine's records in the Django admin too (read-only there).
READ_MODELS = [("workers", "job"), ("workers", "attempt"), ("workers", "workerprocess"), ("koala", "auditevent")]

ROLES = {
    "operators": ["view_operations", "operate"],
    "reviewers": ["view_operations", "review"],
    "auditors": ["view_operations"],
}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    console_type, _ = ContentType.objects.get_or_create(app_label="console", model="console")
    console_perms = {
        codename: Permission.objects.get_or_create(content_type=console_type, codename=codename, defaults={"name": name})[0]
        for codename, name in CONSOLE_PERMISSIONS.items()
    }
    # post_migrate creates model permissions only after all migrations; make the view ones now.
    read_perms = []
    for app_label, model in READ_MODELS:
        model_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
        perm, _ = Permission.objects.get_or_create(
            content_type=model_type, codename=f"view_{model}", defaults={"name": f"Can view {model}"}
        )
        read_perms.append(perm)
    for group_name, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(*[console_perms[c] for c in codenames], *read_perms)


def remove_roles(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Group.objects.filter(name__in=list(ROLES)).delete()


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("workers", "0001_initial"),
        ("koala", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Console",
            fields=[("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID"))],
            options={
                "managed": False,
                "default_permissions": (),
                "permissions": [(codename, name) for codename, name in CONSOLE_PERMISSIONS.items()],
            },
        ),
        migrations.RunPython(create_roles, remove_roles),
    ]
