from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workers", "0004_worker_recent_starts")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="operation_key_base",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="An operator retry's carried key: its operation keys are its original's, so it can never send "
                "an effect twice. Empty: the job's own (idempotency key or koala-job-<id>).",
                max_length=200,
            ),
        ),
    ]
