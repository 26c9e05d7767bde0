"""Two columns on ``workers_workerprocess``: ``stop_requested_at`` (an HTTP worker's stop, read by
the claim in every API server process) and ``contracts`` (the digest of each kind's contract as
the worker's process loaded it).

Expand only: both are new, nullable or with a default; the release before neither reads nor
writes them, and a row it writes gets the database's defaults (``contracts``: ``{}``).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workers", "0020_attempt_limit_reasons")]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="stop_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="contracts",
            field=models.JSONField(
                blank=True, default=dict, db_default=models.Value("{}"), help_text='"name@version" -> digest of its contract.'
            ),
        ),
    ]
