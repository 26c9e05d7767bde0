"""Koala's settings, with the test-only URLconf (tests/web/urls.py). Nothing else changes: the
subprocess runs Koala's real middleware, logging and Sentry set-up."""

from koala.settings import *  # noqa: F403

ROOT_URLCONF = "tests.web.urls"
