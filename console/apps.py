from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    # The browser console: dashboard, jobs, failures, pauses, needs attention, budgets.
    # It holds no state of its own; every change goes through the workers/reviews services.
    name = "console"
    verbose_name = "Koala console"
