"""Attempt.requeued_by: the operator whose requeue took a running attempt's job away.

The console named such an attempt's rejection (lease_superseded) by reading its message
("requeued by …"); the fact is now a column. Attempts written before it carry the actor only in
that message: the backfill copies it, once, so they read as before.

A NOT NULL column with a database default: adding it rewrites no table on PostgreSQL 11+, and
the claim's hand-written INSERT (which does not name it) keeps working during a deploy.
"""

from django.db import migrations, models

BACKFILL = """
UPDATE workers_attempt SET requeued_by = LEFT(substr(error_message, length('requeued by ') + 1), 150)
WHERE outcome = 'interrupted' AND error_message LIKE 'requeued by %' AND requeued_by = ''
"""


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0010_dashboard_bounded"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="requeued_by",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="Who requeued the job while this attempt held it (its holder was fenced); empty otherwise.",
                max_length=150,
            ),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
    ]
