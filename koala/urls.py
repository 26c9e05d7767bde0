from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "Koala"
admin.site.site_title = "Koala admin"
admin.site.index_title = "Jobs, workers and reviews"

urlpatterns = [
    path("admin/django-rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
]
