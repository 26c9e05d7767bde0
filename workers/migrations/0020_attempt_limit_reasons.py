"""Two failure reasons for the per-attempt ceilings (workers.bounds): ``memory_limit`` and ``cpu_limit``.

Expand only: the CHECK on ``workers_job.failure_reason`` only widens, so the release before keeps
working (it never writes the new values). It is widened without holding the table's lock for a
scan: the wider constraint is added NOT VALID (instant), validated (a scan under SHARE UPDATE
EXCLUSIVE, which lets reads and writes go on), then the old one dropped and the new one renamed to
the old name (both instant). ``atomic = False``: each step commits on its own, so the brief ACCESS
EXCLUSIVE lock of the ADD is not held through the VALIDATE's scan.
"""

from django.db import migrations, models

OLD = ["terminal", "fatal", "attempts_exhausted", "orphaned", "deadline_exceeded", "review_rejected", "review_expired"]
NEW = [*OLD, "memory_limit", "cpu_limit"]


def _check(values: list[str]) -> str:
    listed = ", ".join(f"'{v}'" for v in values)
    return f"(failure_reason IS NULL OR failure_reason IN ({listed}))"


FORWARD = [
    f"ALTER TABLE workers_job ADD CONSTRAINT job_failure_reason_valid_wide CHECK {_check(NEW)} NOT VALID",
    "ALTER TABLE workers_job VALIDATE CONSTRAINT job_failure_reason_valid_wide",
    "ALTER TABLE workers_job DROP CONSTRAINT job_failure_reason_valid",
    "ALTER TABLE workers_job RENAME CONSTRAINT job_failure_reason_valid_wide TO job_failure_reason_valid",
]
# Back: only while no job holds a new reason (the VALIDATE refuses otherwise, naming the constraint).
BACKWARD = [
    f"ALTER TABLE workers_job ADD CONSTRAINT job_failure_reason_valid_narrow CHECK {_check(OLD)} NOT VALID",
    "ALTER TABLE workers_job VALIDATE CONSTRAINT job_failure_reason_valid_narrow",
    "ALTER TABLE workers_job DROP CONSTRAINT job_failure_reason_valid",
    "ALTER TABLE workers_job RENAME CONSTRAINT job_failure_reason_valid_narrow TO job_failure_reason_valid",
]

CHOICES = [
    ("terminal", "Terminal"),
    ("fatal", "Fatal"),
    ("attempts_exhausted", "Attempts Exhausted"),
    ("orphaned", "Orphaned"),
    ("deadline_exceeded", "Deadline Exceeded"),
    ("review_rejected", "Review Rejected"),
    ("review_expired", "Review Expired"),
    ("memory_limit", "Memory Limit"),
    ("cpu_limit", "Cpu Limit"),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("workers", "0019_metrics_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="failure_reason",
            field=models.CharField(blank=True, choices=CHOICES, max_length=32, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="job_failure_reason_valid"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("failure_reason__isnull", True), ("failure_reason__in", NEW), _connector="OR"),
                        name="job_failure_reason_valid",
                    ),
                ),
            ],
        ),
    ]
