from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The HTTP API: the worker protocol (five calls) and the run endpoints, behind scoped keys."""

    name = "api"
    label = "api"
    verbose_name = "HTTP API"
    default_auto_field = "django.db.models.BigAutoField"
