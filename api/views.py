"""Dashboard pages for API tokens and MCP sign-ins: list both, create a token
(shown once, with the expiry the person chooses), revoke either (confirmed)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import (
    require_GET,
    require_http_methods,
    require_POST,
)

from api.models import ApiToken, OAuthGrant
from api.oauth import grant_revoke
from api.services import (
    DEFAULT_TOKEN_DAYS,
    ERR_TOKEN_REVOKED,
    TOKEN_DAYS,
    TOKEN_NAME_MAX,
    TokenError,
    token_create,
    token_revoke,
)
from artifacts.quota import quota_usage
from pippa_site.login import login_required

MSG_REVOKED = "Token “{name}” revoked. A runner that still uses it is now turned away."
MSG_SIGNED_OUT = (
    "{name} is signed out: its access and refresh tokens are refused from its"
    " next request on."
)
ERR_SIGNED_OUT = "that sign-in has already ended"
ERR_TOKEN_NOT_FOUND = "API token {id} not found"
ERR_GRANT_NOT_FOUND = "MCP sign-in {id} not found"
# The form's value for a token that lasts until it is revoked.
NEVER = "never"


# The new token between the POST that made it and the page that shows it once.
NEW_TOKEN_KEY = "pippa_new_token"


def _page(request: HttpRequest, status: int = 200, **extra) -> HttpResponse:
    tokens = ApiToken.objects.for_user(request.user)[:200]
    grants = OAuthGrant.objects.for_user(request.user)[:200]
    context = {
        "tokens": tokens,
        "grants": grants,
        "day_choices": [(str(d) if d else NEVER, d) for d in TOKEN_DAYS],
        "days": str(DEFAULT_TOKEN_DAYS),
        "name_max": TOKEN_NAME_MAX,
        "usage": quota_usage(owner_id=request.user.pk),  # the storage partial's
        **extra,
    }
    return render(request, "api/tokens.html", context, status=status)


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
    chosen = request.POST.get("days", str(DEFAULT_TOKEN_DAYS))
    try:
        days = None if chosen == NEVER else int(chosen)
    except ValueError:
        days = -1  # refused by token_create, with the choices
    try:
        new = token_create(user=request.user, name=name, days=days)
    except TokenError as exc:
        return _page(
            request, status=400, error=str(exc), name=name[:100], days=chosen[:10]
        )
    request.session[NEW_TOKEN_KEY] = {"raw": new.raw, "name": new.token.name}
    return redirect("tokens:list")


@require_http_methods(["GET", "POST"])
@login_required
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    """GET: say what revoking does and ask; POST: revoke."""
    token = ApiToken.objects.get_for_user(
        request.user, token_id, error=ERR_TOKEN_NOT_FOUND.format(id=token_id)
    )
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


@require_http_methods(["GET", "POST"])
@login_required
def grant_revoke_view(request: HttpRequest, grant_id: int) -> HttpResponse:
    """GET: say what signing an MCP client out does and ask; POST: sign it out."""
    grant = OAuthGrant.objects.get_for_user(
        request.user, grant_id, error=ERR_GRANT_NOT_FOUND.format(id=grant_id)
    )
    if request.method == "GET":
        if not grant.is_active:
            messages.error(request, ERR_SIGNED_OUT)
            return redirect("tokens:list")
        return render(request, "api/grant_revoke.html", {"grant": grant})
    if grant_revoke(grant=grant):
        messages.success(request, MSG_SIGNED_OUT.format(name=grant.client_name))
    else:
        messages.error(request, ERR_SIGNED_OUT)
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
