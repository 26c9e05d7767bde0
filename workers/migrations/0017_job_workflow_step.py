"""A job may be a workflow's step: the run it belongs to, the step's name, its parents' outputs.

The flows app keeps the run; these columns are what the step's lease carries (workers.services.leases).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workers', '0016_job_state_reason_statistics'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='run_id',
            field=models.BigIntegerField(blank=True, help_text='The workflow run this job is a step of.', null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='step',
            field=models.CharField(blank=True, db_default='', default='', help_text="The step's name in its run.", max_length=100),
        ),
        migrations.AddField(
            model_name='job',
            name='steps',
            field=models.JSONField(blank=True, db_default=models.Value('{}'), default=dict, help_text="Earlier steps' outputs by name (a step's lease)."),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('run_id__isnull', False)), fields=['run_id'], name='job_run_idx'),
        ),
    ]
