from django.apps import AppConfig


class ExportsConfig(AppConfig):
    # CSV exports: the seed's unit of useful work (docs/exports.md).
    name = "exports"
    verbose_name = "Exports"
