from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        from workers import kinds, prepared
        from workers.services import ticks

        kinds.load_configured_kinds()
        # The engine's timer-started tasks (koala_tick prune, budget-report); apps add theirs.
        ticks.register_engine_tasks()
        prepared.install()
