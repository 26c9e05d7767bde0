from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from koala import cli
from workers.dbsession import bound_sessions
from workers.selectors.retention import prunable
from workers.services import retention


class Command(BaseCommand):
    help = (
        "Prune finished jobs older than KOALA_RETENTION_DAYS with their attempts, settled operations and spans "
        "(what koala_beat does every KOALA_RETENTION_INTERVAL_SECONDS): one bounded pass. Live jobs, jobs with an "
        "open operation, jobs of live runs and the audit log are kept. --dry-run prints the counts and changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="print what would be pruned; change nothing")
        parser.add_argument(
            "--days",
            type=cli.bounded_int(0, 36500),
            default=None,
            help="age in days past which finished jobs go, 0-36500 (default KOALA_RETENTION_DAYS; 0 prunes nothing)",
        )
        parser.add_argument(
            "--batches",
            type=cli.bounded_int(1, 100_000),
            default=None,
            help="batches of KOALA_RETENTION_BATCH_SIZE jobs in this pass (default KOALA_RETENTION_BATCHES)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        bound_sessions()
        decided = retention.plan(days=options["days"], batches=options["batches"])
        if decided is None:
            self.stdout.write("retention is off (0 days): nothing is pruned")
            return
        if options["dry_run"]:
            counts = prunable(decided=decided)
            self.stdout.write(
                f"finished before {decided.cutoff:%Y-%m-%d %H:%M:%S}Z: {counts.jobs} jobs and {counts.attempts} attempts "
                f"would be pruned (before the apps keep theirs: live runs, unsettled exports, open reviews); "
                f"{counts.kept_by_operations} jobs kept by an open operation"
            )
            return
        report = retention.prune(days=options["days"], batches=options["batches"])
        self.stdout.write(
            f"pruned {report.jobs} jobs, {report.attempts} attempts, {report.operations} operations in "
            f"{report.batches} batches of at most {settings.KOALA_RETENTION_BATCH_SIZE}; kept {report.kept} "
            f"(the apps': {', '.join(f'{k}={v}' for k, v in sorted(report.apps.items())) or 'none'})"
        )
