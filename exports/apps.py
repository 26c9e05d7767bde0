from django.apps import AppConfig


class ExportsConfig(AppConfig):
    # CSV exports: the seed's unit of useful work (docs/exports.md).
    name = "exports"
    verbose_name = "Exports"

    def ready(self) -> None:
        from exports import beat, services
        from workers import hooks

        hooks.register_beat_task("exports", beat.tick)
        # koala_tick export-cleanup (deploy/systemd/koala-export-cleanup.timer): a daily sweep
        # of what the beat's hourly window missed (a beat that was down, a long outage).
        hooks.register_tick_task(
            "export-cleanup",
            beat.cleanup_tick,
            help=f"settle ended exports and delete the temporary files of those ended in the last {beat.CLEANUP_DAYS} days",
            lease_seconds=300.0,
        )
        # Inside each prune batch (workers.services.retention): an unsettled export keeps its job;
        # a settled one outlives it (its job link set NULL).
        hooks.register_retention("exports", keep=services.keep_jobs_of_unsettled_exports, forget=services.forget_jobs_of_exports)
