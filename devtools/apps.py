from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    # Management commands for local runs (koala_run, koala_demo); no models.
    name = "devtools"
    verbose_name = "Developer tools"
