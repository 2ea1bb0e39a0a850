from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from tasks.models import Conversation


@require_GET
@login_required
def conversation_list(request: HttpRequest) -> HttpResponse:
    conversations = Conversation.objects.for_user(request.user).order_by("-updated_at")[
        :200
    ]
    return render(
        request, "tasks/conversation_list.html", {"conversations": conversations}
    )
