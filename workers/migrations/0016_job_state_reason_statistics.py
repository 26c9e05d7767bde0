"""Extended statistics on the job table: ``failure_reason`` determines ``state`` (only failed jobs
have one).

The console's "failed, reason X" list reads ``failure_reason = X AND state = 'failed'``. Without
these statistics the planner multiplies the two selectivities as if they were independent and
expects a few rows where there are hundreds, so it weighs a bitmap read plus a sort as equal to
the ordered read of ``job_failed_list_idx`` that stops after one page; which one it picks then
depends on the table's dead tuples (tests/integration/test_query_plans.py). With the dependency
known, the estimate is right and the list index wins by far. ANALYZE (autovacuum) fills them in.
"""

from django.db import migrations

CREATE = "CREATE STATISTICS IF NOT EXISTS job_state_reason_stats (dependencies) ON state, failure_reason FROM workers_job"
DROP = "DROP STATISTICS IF EXISTS job_state_reason_stats"


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0015_budget_currency_is_the_cost_currency"),
    ]

    operations = [
        migrations.RunSQL(CREATE, reverse_sql=DROP),
    ]
