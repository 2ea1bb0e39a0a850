from __future__ import annotations

from django.urls import path

from dashboard import views

# Dad's pages: dashboard:conversations, dashboard:task, ...
app_name = "dashboard"
urlpatterns = [
    path("", views.conversation_list, name="conversations"),
    path("conversations/<int:pk>/", views.conversation_detail, name="conversation"),
    path(
        "conversations/<int:pk>/delete/",
        views.conversation_delete,
        name="conversation_delete",
    ),
    path("tasks/<int:pk>/", views.task_detail, name="task"),
    # A message's link to a decision card: survives a login on the way, which
    # would lose the card's #attention-N (a fragment never reaches the server).
    path(
        "tasks/<int:pk>/decide/<int:position>/",
        views.task_decide,
        name="task_decide",
    ),
    path(
        "tasks/<int:pk>/resume-context/",
        views.task_resume_context,
        name="task_resume_context",
    ),
    path(
        "conversations/<int:pk>/demo/run/",
        views.demo_live_run,
        name="demo_live_run",
    ),
    path("tasks/<int:pk>/resume/", views.task_resume, name="task_resume"),
    path("tasks/<int:pk>/pause/", views.task_pause, name="task_pause"),
    path("tasks/<int:pk>/cancel/", views.task_cancel, name="task_cancel"),
    path(
        "tasks/<int:pk>/steps/<int:step_id>/saved-output/",
        views.step_saved_output,
        name="step_saved_output",
    ),
    path("tasks/<int:pk>/branch/", views.task_branch, name="task_branch"),
    path("tasks/<int:pk>/upload/", views.task_upload, name="task_upload"),
    path(
        "tasks/<int:pk>/steps/<int:step_id>/retry/",
        views.step_retry,
        name="step_retry",
    ),
    path(
        "tasks/<int:pk>/steps/<int:step_id>/resolve/",
        views.step_resolve,
        name="step_resolve",
    ),
]
