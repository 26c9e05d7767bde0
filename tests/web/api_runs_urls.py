"""A test URLconf for the execute calls alone (the API's own api/urls.py mounts them the same way)."""

from django.urls import include, path

urlpatterns = [path("api/v1/", include("api.run_urls"))]
