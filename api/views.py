"""Dashboard pages for API tokens: list, create (shown once), revoke (confirmed)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import (
    require_GET,
    require_http_methods,
    require_POST,
)

from api.models import ApiToken
from api.services import (
    ERR_TOKEN_REVOKED,
    TokenError,
    token_create,
    token_revoke,
)

MSG_REVOKED = "Token “{name}” revoked. A runner that still uses it is now turned away."


# The new token between the POST that made it and the page that shows it once.
NEW_TOKEN_KEY = "pippa_new_token"


def _page(request: HttpRequest, status: int = 200, **extra) -> HttpResponse:
    tokens = ApiToken.objects.for_user(request.user)[:200]
    return render(
        request, "api/tokens.html", {"tokens": tokens, **extra}, status=status
    )


@never_cache
@require_GET
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """The tokens; right after one was made, its secret, once (from the session)."""
    new = request.session.pop(NEW_TOKEN_KEY, None)
    if isinstance(new, dict):
        return _page(request, new_token=new.get("raw"), new_name=new.get("name"))
    return _page(request)


@never_cache
@require_POST
@login_required
def token_new(request: HttpRequest) -> HttpResponse:
    """Create a token, then redirect: a reload of the page that shows it makes
    no second token (POST-redirect-GET), and shows the secret no more."""
    name = request.POST.get("name", "")
    try:
        new = token_create(user=request.user, name=name)
    except TokenError as exc:
        return _page(request, status=400, error=str(exc), name=name[:100])
    request.session[NEW_TOKEN_KEY] = {"raw": new.raw, "name": new.token.name}
    return redirect("tokens:list")


@require_http_methods(["GET", "POST"])
@login_required
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    """GET: say what revoking does and ask; POST: revoke."""
    token = get_object_or_404(ApiToken.objects.for_user(request.user), pk=token_id)
    if request.method == "GET":
        if not token.is_active:
            messages.error(request, ERR_TOKEN_REVOKED)
            return redirect("tokens:list")
        return render(request, "api/token_revoke.html", {"token": token})
    try:
        token_revoke(token=token)
    except TokenError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, MSG_REVOKED.format(name=token.name))
    return redirect("tokens:list")


ERR_API_NOT_FOUND = (
    "no such API endpoint: {path} (the schema is at /api/v1/openapi.json)"
)


@csrf_exempt
def api_not_found(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """Unknown paths under /api/ answer as the API does: JSON, 404."""
    return JsonResponse(
        {"detail": ERR_API_NOT_FOUND.format(path=request.path[:200])}, status=404
    )
