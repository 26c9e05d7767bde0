from django.urls import path

from exports import views

app_name = "exports"

urlpatterns = [
    path("<int:export_id>/download/", views.download, name="download"),
]
