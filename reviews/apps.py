from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Reviews"

    def ready(self) -> None:
        # The engine asks this app before a critical operation, through its hooks registry
        # (workers.hooks): it never imports reviews itself.
        from reviews.gate import ReviewQueueGate
        from workers import hooks

        hooks.register_review_gate(ReviewQueueGate())
