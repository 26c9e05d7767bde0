from django.apps import AppConfig


class ExportsConfig(AppConfig):
    # CSV exports: the seed's unit of useful work (docs/exports.md).
    name = "exports"
    verbose_name = "Exports"

    def ready(self) -> None:
        from exports import beat, services
        from workers import hooks

        hooks.register_beat_task("exports", beat.tick)
        # Inside each prune batch (workers.services.retention): an unsettled export keeps its job;
        # a settled one outlives it (its job link set NULL).
        hooks.register_retention("exports", keep=services.keep_jobs_of_unsettled_exports, forget=services.forget_jobs_of_exports)
