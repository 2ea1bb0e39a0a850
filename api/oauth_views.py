"""The OAuth endpoints MCP clients sign in through, and the consent page.

The metadata (RFC 9728, RFC 8414) and the authorize, token, registration and
revocation endpoints are the MCP SDK's own handlers (``mcp.server.auth``),
with CORS as the SDK's routes have it (for clients in a browser, such as the
Inspector), over ``api.oauth.PippaOAuthProvider``. They run here as Django
views, so they are served by every server the site runs under and are
addressed from the request (``build_absolute_uri``: the host and scheme the
client used, checked against ``ALLOWED_HOSTS``). The consent page is the
dashboard's: the person logs in first if need be (the sign-in waits at
``?next=``), then allows or declines.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.request import RawPostDataException
from django.middleware.csp import get_nonce
from django.shortcuts import render
from django.utils.csp import CSP, build_policy
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from mcp.server.auth.handlers.authorize import AuthorizationHandler
from mcp.server.auth.handlers.metadata import (
    MetadataHandler,
    ProtectedResourceMetadataHandler,
)
from mcp.server.auth.handlers.register import RegistrationHandler
from mcp.server.auth.handlers.revoke import RevocationHandler
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.client_auth import ClientAuthenticator
from mcp.server.auth.routes import cors_middleware
from mcp.server.auth.settings import ClientRegistrationOptions
from starlette.routing import request_response

from api import oauth
from pippa_site.bearer import site_base
from pippa_site.login import login_required

ERR_CONSENT_STALE = (
    "This sign-in request has expired or is not one this site made. Start the"
    " sign-in again from your agent."
)
ERR_DAYS = "Choose how long it may stay signed in."
REGISTRATION = ClientRegistrationOptions(
    enabled=True, valid_scopes=[oauth.SCOPE], default_scopes=[oauth.SCOPE]
)
READ = ["GET", "OPTIONS"]
WRITE = ["POST", "OPTIONS"]


async def _asgi(app, request: HttpRequest, *, form=None) -> HttpResponse:
    """Answer ``request`` with an ASGI application (an SDK handler).

    ``form`` replaces the request's form fields (urlencoded).
    """
    headers = {name.lower(): value for name, value in request.headers.items()}
    try:
        body = request.body if form is None else None
    except RawPostDataException:
        # The text rule (pippa_site.middleware) read the form already: the
        # same fields, encoded again, are the same request to the handler.
        form = request.POST
    if form is not None:
        body = urlencode(list(form.lists()), doseq=True).encode()
        headers["content-type"] = "application/x-www-form-urlencoded"
        headers.pop("content-length", None)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        "headers": [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in headers.items()
        ],
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
        "server": (request.get_host(), 0),
    }

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    started: dict = {}
    chunks: list[bytes] = []

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    response = HttpResponse(b"".join(chunks), status=started["status"])
    for name, value in started.get("headers", []):
        if name.lower() != b"content-length":
            response[name.decode("latin-1")] = value.decode("latin-1")
    return response


def _provider(request: HttpRequest) -> oauth.PippaOAuthProvider:
    return oauth.PippaOAuthProvider(site_base(request))


@csrf_exempt
@require_http_methods(READ)
async def protected_resource(request: HttpRequest) -> HttpResponse:
    """RFC 9728 metadata of ``/mcp/`` (at the well-known path and below it)."""
    metadata = oauth.protected_resource_metadata(site_base(request))
    handler = ProtectedResourceMetadataHandler(metadata)
    return await _asgi(cors_middleware(handler.handle, READ), request)


@csrf_exempt
@require_http_methods(READ)
async def authorization_server(request: HttpRequest) -> HttpResponse:
    """RFC 8414 metadata: this site is its own authorization server."""
    metadata = oauth.authorization_server_metadata(site_base(request))
    handler = MetadataHandler(metadata)
    return await _asgi(cors_middleware(handler.handle, READ), request)


@csrf_exempt
@require_http_methods(["GET", "POST"])
async def authorize(request: HttpRequest) -> HttpResponse:
    """Check the authorization request (PKCE S256, the client's redirect URI,
    the resource), then send the browser to the consent page."""
    handler = AuthorizationHandler(_provider(request))
    return await _asgi(request_response(handler.handle), request)


@csrf_exempt
@require_http_methods(WRITE)
async def token(request: HttpRequest) -> HttpResponse:
    """Exchange a code (with its PKCE verifier) or a refresh token for tokens."""
    provider = _provider(request)
    handler = TokenHandler(provider, ClientAuthenticator(provider))
    return await _asgi(cors_middleware(handler.handle, WRITE), request)


@csrf_exempt
@require_http_methods(WRITE)
async def register(request: HttpRequest) -> HttpResponse:
    """RFC 7591 dynamic client registration."""
    handler = RegistrationHandler(_provider(request), options=REGISTRATION)
    return await _asgi(cors_middleware(handler.handle, WRITE), request)


@csrf_exempt
@require_http_methods(WRITE)
async def revoke(request: HttpRequest) -> HttpResponse:
    """RFC 7009: a client signs itself out (the whole grant goes)."""
    provider = _provider(request)
    handler = RevocationHandler(provider, ClientAuthenticator(provider))
    form = None
    if request.method == "POST" and "client_secret" not in request.POST:
        # RFC 7009: a public client sends no secret; the SDK's revocation
        # request model requires the field (as an empty one), so it is added.
        form = request.POST.copy()
        form["client_secret"] = ""
    return await _asgi(cors_middleware(handler.handle, WRITE), request, form=form)


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def consent(request: HttpRequest) -> HttpResponse:
    """Ask the person whether the client may act as them; answer the client.

    GET shows who asks, where the answer goes and for how long; POST with
    ``decision=allow`` sends the browser back to the client with a code, any
    other decision with ``access_denied``.
    """
    signed = request.POST.get("request") or request.GET.get("request", "")
    asked = oauth.consent_read(signed)
    if asked is None:
        return render(
            request, "api/oauth_consent.html", {"stale": ERR_CONSENT_STALE}, status=400
        )
    base = site_base(request)
    if request.method == "GET":
        return _consent_page(request, asked, signed)
    if request.POST.get("decision") != "allow":
        return HttpResponseRedirect(oauth.consent_answer(asked, base=base))
    try:
        days = int(request.POST.get("days", ""))
    except ValueError:
        days = None
    if days not in oauth.GRANT_DAYS:
        return _consent_page(request, asked, signed, error=ERR_DAYS, status=400)
    return HttpResponseRedirect(
        oauth.consent_answer(asked, base=base, user=request.user, days=days)
    )


def _consent_page(request, asked, signed, *, error: str = "", status: int = 200):
    response = render(
        request,
        "api/oauth_consent.html",
        {
            "client_name": asked["n"],
            "redirect": oauth.redirect_shown(asked["r"]),
            "request_token": signed,
            "day_choices": oauth.GRANT_DAYS,
            "default_days": oauth.DEFAULT_GRANT_DAYS,
            "error": error,
        },
        status=status,
    )
    # The form's answer is a redirect to the client: a browser applies the
    # page's form-action to where the form's answer redirects, so the
    # client's origin is allowed there (on this page only).
    policy = {
        **settings.SECURE_CSP,
        "form-action": [CSP.SELF, oauth.redirect_shown(asked["r"])],
    }
    response[str(CSP.HEADER_ENFORCE)] = build_policy(policy, get_nonce(request))
    return response
