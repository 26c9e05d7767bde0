from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    # The review queue (issue 3/5) lives here; this app is the home it will fill.
    name = "reviews"
    verbose_name = "Reviews"
