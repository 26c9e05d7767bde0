"""AuditEvent.action takes its choices from koala.audit.AuditAction (state only: no SQL).

The stored values are unchanged (the enum keeps every value rows carried before it), so no
row is rewritten.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("koala", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="auditevent",
            name="action",
            field=models.CharField(
                choices=[
                    ("read", "read: a person read run data"),
                    ("enqueue", "enqueue: jobs enqueued by a person"),
                    ("cancel", "cancel: cancel a job"),
                    ("retry", "retry: retry a job as a new one"),
                    ("requeue", "requeue: requeue a job"),
                    ("bulk_cancel", "bulk_cancel: cancel selected jobs"),
                    ("bulk_retry", "bulk_retry: retry selected jobs"),
                    ("bulk_requeue", "bulk_requeue: requeue selected jobs"),
                    ("pause", "pause: pause a scope"),
                    ("resume", "resume: lift a pause"),
                    ("budget.create", "budget.create: create a budget"),
                    ("budget.update", "budget.update: change a budget's limits"),
                    ("price.set", "price.set: set a model price"),
                    ("operation.resolve", "operation.resolve: settle an uncertain operation"),
                    ("review.requested", "review.requested: an approval asked for"),
                    ("review.superseded", "review.superseded: superseded by a changed action"),
                    ("review.approve", "review.approve: approve a review"),
                    ("review.reject", "review.reject: reject a review"),
                    ("review.expired", "review.expired: expired undecided"),
                    ("review.withdrawn", "review.withdrawn: withdrawn with its cancelled job"),
                    ("export.request", "export.request: request an export"),
                    ("export.cancel", "export.cancel: cancel an export"),
                    ("export.download", "export.download: download an export"),
                    ("export.grant_access", "export.grant_access: grant access to an account's exports"),
                ],
                max_length=64,
            ),
        ),
    ]
