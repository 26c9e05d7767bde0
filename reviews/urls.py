"""The review queue, mounted under /admin/console/reviews/."""

from django.urls import path

from reviews import views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("<int:review_id>/", views.detail, name="detail"),
    path("<int:review_id>/decide/", views.decide, name="decide"),
]
