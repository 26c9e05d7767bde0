from django.db import migrations, models


class Migration(migrations.Migration):
    """A budget is in the cost currency (KOALA_COST_CURRENCY): Budget.currency is no longer a field.

    Spend is priced and reserved in the cost currency and nothing converts, so a budget's own
    currency could only be wrong. The column stays in the database for now, unread, with a
    database default, so that a worker of the previous release still running during the deploy
    can read and write budgets; a later migration drops it.
    """

    dependencies = [
        ("workers", "0014_operation_currency"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterField(
                    model_name="budget",
                    name="currency",
                    field=models.CharField(db_default="EUR", default="EUR", max_length=3),
                ),
            ],
            state_operations=[
                migrations.RemoveField(model_name="budget", name="currency"),
            ],
        ),
    ]
