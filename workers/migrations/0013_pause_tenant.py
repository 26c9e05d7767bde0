from django.db import migrations, models


class Migration(migrations.Migration):
    """A pause may hold one tenant's jobs only (a budget's overshoot on that tenant's budget)."""

    dependencies = [
        ("workers", "0012_http_workers"),
    ]

    operations = [
        migrations.AddField(
            model_name="pause",
            name="tenant",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="Holds only jobs whose input names this tenant; empty: every tenant.",
                max_length=100,
            ),
        ),
        migrations.RemoveConstraint(
            model_name="pause",
            name="pause_one_live_per_scope",
        ),
        migrations.AddConstraint(
            model_name="pause",
            constraint=models.UniqueConstraint(
                condition=models.Q(("lifted_at__isnull", True)),
                fields=("scope", "target", "tenant"),
                name="pause_one_live_per_scope",
            ),
        ),
    ]
