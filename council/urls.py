from __future__ import annotations

from django.urls import path

from council import views

app_name = "council"
urlpatterns = [
    path("rounds/<int:round_id>/", views.round_detail, name="round"),
    path(
        "rounds/<int:round_id>/conclude/",
        views.round_conclude_view,
        name="round_conclude",
    ),
    path("rounds/<int:round_id>/context.json", views.round_context, name="context"),
    path(
        "turns/<int:turn_id>/context/",
        views.turn_context_page,
        name="turn_context_page",
    ),
    path("turns/<int:turn_id>/context.json", views.turn_context, name="turn_context"),
]
