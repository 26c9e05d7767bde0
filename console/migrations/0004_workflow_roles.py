"""Workflow runs in the console: who may start, signal, cancel and move runs, and the roles'
read-only view of runs, steps and signals in the Django admin.

| group | gets |
| --- | --- |
| operators | run_workflows (start, cancel, move stranded runs), signal_runs |
| reviewers | signal_runs (a reviewer's approval is a signal) |
| every role | view_run, view_runstep, view_signal (the admin's read-only pages) |
"""

from django.db import migrations

CONSOLE_PERMISSIONS = {
    "run_workflows": "Can start and cancel workflow runs and move stranded runs to another version",
    "signal_runs": "Can send signals to workflow runs",
}
GRANTS = {"operators": ["run_workflows", "signal_runs"], "reviewers": ["signal_runs"]}
READ_MODELS = [("flows", "run"), ("flows", "runstep"), ("flows", "signal")]
ROLES = ("operators", "reviewers", "auditors")


def grant(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    console_type, _ = ContentType.objects.get_or_create(app_label="console", model="console")
    console_perms = {
        codename: Permission.objects.get_or_create(content_type=console_type, codename=codename, defaults={"name": name})[0]
        for codename, name in CONSOLE_PERMISSIONS.items()
    }
    reads = []
    for app_label, model in READ_MODELS:
        model_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
        reads.append(
            Permission.objects.get_or_create(
                content_type=model_type, codename=f"view_{model}", defaults={"name": f"Can view {model}"}
            )[0]
        )
    for name in ROLES:
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*reads, *[console_perms[c] for c in GRANTS.get(name, [])])


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(content_type__app_label="console", codename__in=list(CONSOLE_PERMISSIONS)).delete()
    reads = Permission.objects.filter(content_type__app_label="flows", codename__in=[f"view_{m}" for _, m in READ_MODELS])
    Group = apps.get_model("auth", "Group")
    for group in Group.objects.filter(name__in=ROLES):
        group.permissions.remove(*reads)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0003_exports_read_roles"),
        ("flows", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="console",
            options={
                "managed": False,
                "default_permissions": (),
                "permissions": [
                    ("view_operations", "Can view the Koala console: dashboard, jobs, failures, reviews, budgets"),
                    ("operate", "Can pause/resume, retry/cancel/requeue jobs, resolve operations and edit budgets"),
                    ("review", "Can approve or reject review requests"),
                    ("run_workflows", "Can start and cancel workflow runs and move stranded runs to another version"),
                    ("signal_runs", "Can send signals to workflow runs"),
                ],
            },
        ),
        migrations.RunPython(grant, revoke),
    ]
