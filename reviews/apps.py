from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    # The review gate: ReviewRequest and its services. The engine never imports this app; it
    # reaches it through workers.hooks, filled here.
    name = "reviews"
    verbose_name = "Reviews"

    def ready(self) -> None:
        from reviews import services
        from reviews.gate import ReviewGateImpl
        from workers import hooks

        hooks.register_review_gate(ReviewGateImpl())
        hooks.register_beat_task("reviews", _expire_reviews)
        # Inside cancel_job's transaction, after it locked the job row (lock order job, then review).
        hooks.register_on_cancel("reviews", services.withdraw_open_reviews)
        # Inside each prune batch (workers.services.retention): open reviews keep their job,
        # decided ones go with it.
        hooks.register_retention("reviews", keep=services.keep_jobs_with_open_reviews, forget=services.forget_reviews)


def _expire_reviews() -> dict[str, int]:
    from reviews.services import expire_reviews

    return {"expired": expire_reviews()}
