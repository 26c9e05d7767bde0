from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from workers.management.commands._common import add_actor_argument, cli_actor, existing_job, job_id
from workers.selectors.jobs import job_for_person


class Command(BaseCommand):
    help = "Inspect one job and its attempts (input shown redacted). The read is audited."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=job_id)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        add_actor_argument(parser, "reads")

    def handle(self, *args: Any, **options: Any) -> None:
        # The job as every page shows it (a copy redacted with the job's context); the read is audited.
        view = job_for_person(job_id=existing_job(options["job_id"]).pk, actor=cli_actor(options["actor"]))
        job = view.job
        attempts = [
            {
                "number": a.number,
                "worker": a.worker_id,
                "lease_token": a.lease_token,
                "outcome": a.outcome,
                "started_at": a.started_at.isoformat(),
                "finished_at": a.finished_at.isoformat() if a.finished_at else None,
                "error": error,
                "compute_s": a.compute_seconds,
                "db_wait_s": a.db_wait_seconds,
                "storage_wait_s": a.storage_wait_seconds,
            }
            for a, error in ((row.attempt, row.error) for row in view.attempts)
        ]
        record = {
            "id": job.pk,
            "kind": job.kind,
            "version": job.version,
            "queue": job.queue,
            "state": job.state,
            "delivery": job.delivery,
            "attempts": f"{job.attempts}/{job.max_attempts}",
            "idempotency_key": job.idempotency_key,
            "input": view.input,
            "scheduled_at": job.scheduled_at.isoformat(),
            "deadline_at": job.deadline_at.isoformat() if job.deadline_at else None,
            "lease": {
                "token": job.lease_token,
                "holder": job.lease_holder,
                "expires_at": job.lease_expires_at.isoformat() if job.lease_expires_at else None,
            },
            "progress": view.progress,
            "run_state": view.run_state,
            "result": view.result,
            "usage": view.usage,
            "failure_reason": job.failure_reason,
            "error": view.error,
            "trace_id": job.trace_id,
            "correlation_id": job.correlation_id,
            "created_by": job.created_by,
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
