"""Workflow runs: Run, RunStep, Signal (flows.models)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('workers', '0017_job_workflow_step'),
    ]

    operations = [
        migrations.CreateModel(
            name='Run',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('definition', models.CharField(max_length=60)),
                ('version', models.PositiveIntegerField(help_text="The definition's version the run's next steps are enqueued at.")),
                ('state', models.CharField(choices=[('running', 'Running'), ('waiting', 'Waiting'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='running', max_length=16)),
                ('input', models.JSONField(blank=True, default=dict)),
                ('input_digest', models.CharField(max_length=64)),
                ('run_state', models.JSONField(blank=True, default=dict, help_text="The run's state: step deltas merged by top-level key.")),
                ('idempotency_key', models.CharField(blank=True, max_length=200, null=True)),
                ('trace_id', models.CharField(blank=True, default='', max_length=32)),
                ('correlation_id', models.CharField(blank=True, default='', max_length=64)),
                ('created_by', models.CharField(blank=True, default='', max_length=150)),
                ('error_code', models.CharField(blank=True, default='', max_length=64)),
                ('error', models.TextField(blank=True, default='', help_text='Why the run failed or was cancelled (redacted).')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'indexes': [models.Index(fields=['-created_at', '-id'], name='run_list_idx'), models.Index(fields=['state', '-created_at', '-id'], name='run_state_list_idx'), models.Index(condition=models.Q(('state__in', ['running', 'waiting'])), fields=['definition', 'version'], name='run_live_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('state__in', ['running', 'waiting', 'succeeded', 'failed', 'cancelled'])), name='run_state_valid'), models.CheckConstraint(condition=models.Q(models.Q(('finished_at__isnull', False), ('state__in', ['succeeded', 'failed', 'cancelled'])), models.Q(('finished_at__isnull', True), ('state__in', ['running', 'waiting'])), _connector='OR'), name='run_finished_iff_terminal'), models.UniqueConstraint(condition=models.Q(('idempotency_key__isnull', False)), fields=('definition', 'idempotency_key'), name='run_idempotency_key_unique_per_definition')],
            },
        ),
        migrations.CreateModel(
            name='RunStep',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=60)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('queued', 'Queued'), ('parked', 'Parked'), ('waiting', 'Waiting'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('skipped', 'Skipped'), ('cancelled', 'Cancelled')], default='pending', max_length=16)),
                ('version', models.PositiveIntegerField(blank=True, help_text='The version its job was enqueued at.', null=True)),
                ('output', models.JSONField(blank=True, null=True)),
                ('state_after', models.JSONField(blank=True, help_text="The run's state right after this step merged its delta.", null=True)),
                ('error_code', models.CharField(blank=True, default='', max_length=64)),
                ('error', models.TextField(blank=True, default='')),
                ('wait_deadline', models.DateTimeField(blank=True, null=True)),
                ('due_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='workers.job')),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='flows.run')),
            ],
            options={
                'ordering': ['run_id', 'id'],
                'indexes': [models.Index(fields=['job'], name='runstep_job_idx'), models.Index(condition=models.Q(('state', 'waiting')), fields=['wait_deadline'], name='runstep_wait_deadline_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'queued', 'parked', 'waiting', 'succeeded', 'failed', 'skipped', 'cancelled'])), name='runstep_state_valid'), models.UniqueConstraint(fields=('run', 'name'), name='runstep_one_per_name')],
            },
        ),
        migrations.CreateModel(
            name='Signal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('key', models.CharField(max_length=200)),
                ('payload', models.JSONField(blank=True, default=dict)),
                ('status', models.CharField(choices=[('buffered', 'Buffered'), ('consumed', 'Consumed')], default='buffered', max_length=16)),
                ('consumed_by', models.CharField(blank=True, default='', help_text='The wait step that took it.', max_length=60)),
                ('sent_by', models.CharField(blank=True, default='', max_length=150)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('consumed_at', models.DateTimeField(blank=True, null=True)),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='signals', to='flows.run')),
            ],
            options={
                'ordering': ['run_id', 'id'],
                'indexes': [models.Index(condition=models.Q(('status', 'buffered')), fields=['run', 'name', 'id'], name='signal_buffered_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('status__in', ['buffered', 'consumed'])), name='signal_status_valid'), models.UniqueConstraint(fields=('run', 'name', 'key'), name='signal_one_per_run_name_key')],
            },
        ),
    ]
