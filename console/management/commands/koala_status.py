from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.selectors.status import Level, status_checks


class Command(BaseCommand):
    help = (
        "One line per health check (oldest due job per queue, last completion, workers, breaker, "
        "budgets, beat, pending reviews) and exit 0 ok / 1 warning / 2 critical: a monitoring probe "
        "or a systemd ExecCondition= guard. Thresholds: KOALA_STATUS_* settings. Reads only."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object (checks and the overall level)")

    def handle(self, *args: Any, **options: Any) -> None:
        checks = status_checks()
        worst = max((check.level for check in checks), default=Level.OK)
        if options["json"]:
            document = {
                "status": worst.name.lower(),
                "checks": [{"name": c.name, "level": c.level.name.lower(), "detail": c.detail} for c in checks],
            }
            self.stdout.write(json.dumps(document, indent=None))
        else:
            width = max(len(check.name) for check in checks)
            for check in checks:
                self.stdout.write(f"{check.level.name:<8} {check.name:<{width}}  {check.detail}")
        if worst:
            named = " ".join(check.name for check in checks if check.level == worst)
            raise CommandError(f"{worst.name.lower()}: {named}", returncode=int(worst))
