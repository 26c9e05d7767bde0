from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "metrics"
    verbose_name = "Metrics"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from metrics import services
        from workers import hooks

        hooks.register_beat_task("metrics", services.fold)
        hooks.register_retention("metrics", forget=services.fold_pruned)
        hooks.register_rejection_counter("metrics", services.count_rejection)
