#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "koala.settings")
    from koala.commandline import allow_help_without_services

    # `manage.py help` and `manage.py COMMAND --help` need no PostgreSQL or Redis (koala/commandline.py).
    allow_help_without_services(sys.argv, os.environ)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
