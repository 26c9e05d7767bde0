from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    # Schedules: cron or interval slots materialised into jobs, one per slot (docs/schedules.md).
    # The engine never imports this app; its tick is a beat task registered through workers.hooks.
    name = "schedules"
    verbose_name = "Schedules"

    def ready(self) -> None:
        from schedules import services
        from workers import hooks

        hooks.register_beat_task("schedules", services.beat_tick)
