from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from koala.audit import record_audit
from workers import kinds
from workers.management.commands._common import cli_actor, existing_job


class Command(BaseCommand):
    help = "Inspect one job and its attempts (input shown redacted). The read is audited."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=int)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--actor", default=None, help="who reads (default: $USER@cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        job = existing_job(options["job_id"])
        redactor = kinds.job_redactor(job)  # what every page about this job masks, masked here too
        with transaction.atomic():
            record_audit(actor=cli_actor(options["actor"]), action="read", target_type="job", target_id=job.pk)
        attempts = [
            {
                "number": a.number,
                "worker": a.worker_id,
                "lease_token": a.lease_token,
                "outcome": a.outcome,
                "started_at": a.started_at.isoformat(),
                "finished_at": a.finished_at.isoformat() if a.finished_at else None,
                "error": redactor.text(f"{a.error_class}: {a.error_message}" if a.error_class else a.error_message),
                "compute_s": a.compute_seconds,
                "db_wait_s": a.db_wait_seconds,
                "storage_wait_s": a.storage_wait_seconds,
            }
            for a in job.attempt_set.all()
        ]
        record = {
            "id": job.pk,
            "kind": job.kind,
            "version": job.version,
            "queue": job.queue,
            "state": job.state,
            "delivery": job.delivery,
            "attempts": f"{job.attempts}/{job.max_attempts}",
            "idempotency_key": redactor.data(job.idempotency_key),
            "input": redactor.data(job.input),
            "scheduled_at": job.scheduled_at.isoformat(),
            "deadline_at": job.deadline_at.isoformat() if job.deadline_at else None,
            "lease": {
                "token": job.lease_token,
                "holder": job.lease_holder,
                "expires_at": job.lease_expires_at.isoformat() if job.lease_expires_at else None,
            },
            "progress": redactor.data(job.progress),
            "run_state": redactor.data(job.run_state),
            "result": redactor.data(job.result),
            "usage": redactor.data(job.usage),
            "failure_reason": job.failure_reason,
            "error": redactor.text(f"{job.error_class}: {job.error_message}") if job.error_class else "",
            "trace_id": job.trace_id,
            "correlation_id": job.correlation_id,
            "created_by": redactor.text(job.created_by, limit=None),
            "attempt_log": attempts,
        }
        if options["json"]:
            self.stdout.write(json.dumps(record, indent=2, default=str))
            return
        for key, value in record.items():
            if key != "attempt_log":
                self.stdout.write(f"{key:>16}: {json.dumps(value, default=str) if isinstance(value, dict | list) else value}")
        self.stdout.write("attempts:")
        for a in attempts:
            outcome = a["outcome"] or "running"
            self.stdout.write(f"  #{a['number']} {outcome:<12} worker={a['worker']} token={a['lease_token']} {a['error'] or ''}")
