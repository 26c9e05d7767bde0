from django.conf import settings
from django.db import migrations, models

# Rows recorded before the column existed: a kind that put its currency in its parameters
# (shop.order_and_charge does) had it there; any other amount was in the cost currency, the
# ledger's default from now on.
BACKFILL = """
UPDATE workers_operation
SET currency = CASE WHEN params->>'currency' ~ '^[A-Z]{3}$' THEN params->>'currency' ELSE %s END
WHERE amount_minor IS NOT NULL
"""


def backfill(apps, schema_editor):
    schema_editor.execute(BACKFILL, [settings.KOALA_COST_CURRENCY])


class Migration(migrations.Migration):
    """An operation keeps the currency of its amount (the job page showed a params key)."""

    dependencies = [
        ("workers", "0013_pause_tenant"),
    ]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="currency",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The currency of amount_minor: the one the step named, else KOALA_COST_CURRENCY.",
                max_length=3,
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
