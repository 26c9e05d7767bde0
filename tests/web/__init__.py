"""A test-only web app: Koala's settings and URLs plus a page that fails on purpose.

Loaded only by tests that start a web subprocess with DJANGO_SETTINGS_MODULE=tests.web.settings;
production URLs never include it.
"""
