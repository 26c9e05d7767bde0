from django.apps import AppConfig


class FlowsConfig(AppConfig):
    # Workflow runs above the engine: the engine never imports this app; it reaches it through
    # workers.hooks, filled here (docs/architecture.md).
    name = "flows"
    verbose_name = "Workflows"

    def ready(self) -> None:
        from flows import services
        from workers import hooks

        # Inside every transaction that changes a job's state: a step's end merges its state and
        # makes its dependants due in the same commit (flows.services.on_transitions).
        hooks.register_on_transition("flows", services.on_transitions)
        hooks.register_beat_task("flows", services.beat)
        # Inside each prune batch (workers.services.retention): a live or young run keeps its
        # steps' jobs; a finished run goes with its last job.
        hooks.register_retention("flows", keep=services.keep_jobs_of_live_runs, forget=services.forget_jobs_of_runs)
