from __future__ import annotations

from django.urls import path

from tasks import views

app_name = "tasks"
urlpatterns = [
    path("", views.conversation_list, name="conversations"),
    path("conversations/<int:pk>/", views.conversation_detail, name="conversation"),
    path(
        "conversations/<int:pk>/delete/",
        views.conversation_delete,
        name="conversation_delete",
    ),
    path("tasks/<int:pk>/", views.task_detail, name="task"),
    path(
        "tasks/<int:pk>/resume-context/",
        views.task_resume_context,
        name="task_resume_context",
    ),
    path("tasks/<int:pk>/resume/", views.task_resume, name="task_resume"),
    path("tasks/<int:pk>/branch/", views.task_branch, name="task_branch"),
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
