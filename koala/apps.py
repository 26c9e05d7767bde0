from django.apps import AppConfig


class KoalaConfig(AppConfig):
    name = "koala"
    verbose_name = "Koala"

    def ready(self) -> None:
        from koala import checks  # noqa: F401  (registers the system checks)
