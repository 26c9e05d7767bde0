from django.apps import AppConfig


class EffectsConfig(AppConfig):
    # Provider clients and the email/order/charge/model kinds (KOALA_JOB_KIND_MODULES registers
    # effects.kinds). No models, so no migrations: the ledger rows are the engine's.
    name = "effects"
    verbose_name = "Effects"
