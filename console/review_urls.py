"""The review queue, mounted under /admin/console/reviews/.

Its own URLconf only to keep the ``reviews:`` namespace the templates and the admin link use;
the views are the console's (console/views/reviews.py)."""

from django.urls import path

from console.views import reviews as views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("<int:review_id>/", views.detail, name="detail"),
    path("<int:review_id>/decide/", views.decide, name="decide"),
]
