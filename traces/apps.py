from django.apps import AppConfig


class TracesConfig(AppConfig):
    # Traces (docs/operations.md, "Traces"): each job attempt a span, the spans its body recorded
    # under it, stored here and exported over OTLP/HTTP when configured. The engine never imports
    # this app; it reaches it through workers.hooks, filled here.
    name = "traces"
    verbose_name = "Traces"

    def ready(self) -> None:
        from traces import services
        from workers import hooks

        # Inside the transaction that records each transition: the attempts that ended get their span.
        hooks.register_on_transition("traces", services.record_attempt_spans)
        # Inside the transaction that records an attempt's end: the spans its body recorded.
        hooks.register_span_sink("traces", services.record_body_spans)
        hooks.register_beat_task("traces", services.export_tick)
        # Inside each prune batch (workers.services.retention): a pruned job's spans go with it.
        hooks.register_retention("traces", forget=services.forget_spans)
