from django.apps import AppConfig


class ExportsConfig(AppConfig):
    # CSV exports: the seed's unit of useful work (docs/exports.md).
    name = "exports"
    verbose_name = "Exports"

    def ready(self) -> None:
        from exports import beat
        from workers import hooks

        hooks.register_beat_task("exports", beat.tick)
