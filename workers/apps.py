from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        from workers import kinds

        kinds.load_configured_kinds()
