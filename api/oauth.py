"""OAuth 2.1 for MCP clients, as the MCP authorization spec describes it.

An MCP client (Claude Code, Codex CLI, Gemini CLI, the Inspector, the SDKs)
that meets a 401 at ``/mcp/`` reads this site's protected-resource metadata
(RFC 9728) and authorization-server metadata (RFC 8414), registers itself
(dynamic client registration, RFC 7591), sends its person's browser to the
consent page with a PKCE challenge (S256), and exchanges the code for a
short-lived access token bound to ``/mcp/`` (RFC 8707) and a refresh token.

The protocol's rules (what a request must hold, PKCE, redirect URIs, client
authentication, error answers) are the MCP SDK's own handlers
(``mcp.server.auth``); this module is the provider they call
(``PippaOAuthProvider``), over Django:

- A registered client is not a row: its ``client_id`` is its metadata,
  signed (``django.core.signing``), and its secret an HMAC of that id. So an
  open registration endpoint writes nothing, and every row stays one user's.
- A consent request and an authorization code are signed documents too; the
  code is single-use because exchanging it creates the grant under the code's
  nonce (unique): a second exchange is refused and revokes that grant.
- The grant (``api.models.OAuthGrant``) is the user's row: the sha256 of the
  current access token and refresh token (rotated on every refresh; a
  replaced refresh token presented again revokes the grant), and the end of
  the sign-in the person chose. Revoking it (the tokens page, or RFC 7009's
  endpoint) stops both tokens.

Static API tokens (``api.services``) stay for scripts and the JSON API; the
JSON API does not take these access tokens (their audience is ``/mcp/``).
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import salted_hmac
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    RegistrationError,
    TokenError,
    construct_redirect_uri,
)
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)

from api.models import OAuthGrant
from api.services import TOKEN_RAW_MAX, token_authenticate, token_hash

# The one scope: act as the person on their tasks (read and run them).
SCOPE = "tasks"
MCP_PATH = "/mcp/"
RESOURCE_NAME = "Pippa Stateful"
ACCESS_PREFIX = "pipa_"
REFRESH_PREFIX = "pipr_"
# An authorization code is exchanged within this many seconds, or not at all.
CODE_SECONDS = 300
# The consent page of one sign-in stays valid this long.
CONSENT_SECONDS = 900
# How long a sign-in may last, in days, as the consent page offers it.
GRANT_DAYS = (1, 7, 30, 90, 365)
DEFAULT_GRANT_DAYS = 30
# A client's registered metadata, signed into its id, is at most this large.
MAX_CLIENT_BYTES = 4096
MAX_REDIRECT_URIS = 10
MAX_CLIENT_NAME = 100
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
AUTH_METHODS = ("none", "client_secret_post", "client_secret_basic")

ERR_CLIENT_TOO_LARGE = f"the client's metadata is larger than {MAX_CLIENT_BYTES} bytes"
ERR_TOO_MANY_REDIRECTS = f"register at most {MAX_REDIRECT_URIS} redirect_uris"
ERR_REDIRECT = (
    "redirect_uri {uri} is refused: use https://, or http:// to this machine"
    " (localhost, 127.0.0.1 or [::1]), without a fragment"
)
ERR_RESOURCE = (
    "this server issues tokens for {expected} only, not for {given} (RFC 8707)"
)
ERR_CODE_USED = (
    "this authorization code was already exchanged; the sign-in it started is"
    " revoked (sign in again)"
)
ERR_USER_GONE = "the person who approved this sign-in can no longer sign in"
ERR_REFRESH_USED = (
    "this refresh token was already used (a refresh replaces it); sign in again"
)

_clients = signing.Signer(salt="pippa.oauth.client", sep=".")
_codes = signing.Signer(salt="pippa.oauth.code", sep=".")
_consents = signing.TimestampSigner(salt="pippa.oauth.consent", sep=".")


# -- where: this site as issuer and resource, from the request's own address ----


def mcp_resource(base: str) -> str:
    """The canonical address of the MCP server, the tokens' audience."""
    return f"{base}{MCP_PATH}"


def resource_metadata_url(base: str) -> str:
    """RFC 9728 §3.1: the well-known path inserted before the resource's path."""
    return f"{base}/.well-known/oauth-protected-resource{MCP_PATH}"


def same_resource(given: str, expected: str) -> bool:
    """Whether two resource URLs name the same server (case of scheme and host,
    the default port and a trailing slash aside)."""

    def canonical(url: str) -> tuple[str, str, str] | None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        if parts.query or parts.fragment or not parts.hostname:
            return None
        scheme = parts.scheme.lower()
        default = {"http": 80, "https": 443}.get(scheme)
        host = parts.hostname.lower()
        netloc = host if port in (None, default) else f"{host}:{port}"
        return scheme, netloc, parts.path.rstrip("/")

    found = canonical(given)
    return found is not None and found == canonical(expected)


def authorization_server_metadata(base: str) -> OAuthMetadata:
    """RFC 8414: where to authorize, exchange, register and revoke, and how."""
    return OAuthMetadata(
        issuer=base,
        authorization_endpoint=base + reverse("oauth:authorize"),
        token_endpoint=base + reverse("oauth:token"),
        registration_endpoint=base + reverse("oauth:register"),
        revocation_endpoint=base + reverse("oauth:revoke"),
        scopes_supported=[SCOPE],
        response_types_supported=["code"],
        grant_types_supported=["authorization_code", "refresh_token"],
        token_endpoint_auth_methods_supported=list(AUTH_METHODS),
        revocation_endpoint_auth_methods_supported=list(AUTH_METHODS),
        code_challenge_methods_supported=["S256"],
        authorization_response_iss_parameter_supported=True,
    )


def protected_resource_metadata(base: str) -> ProtectedResourceMetadata:
    """RFC 9728: the MCP server's address and who issues its tokens."""
    return ProtectedResourceMetadata(
        resource=mcp_resource(base),
        authorization_servers=[base],
        scopes_supported=[SCOPE],
        bearer_methods_supported=["header"],
        resource_name=RESOURCE_NAME,
    )


def mcp_challenge(base: str, *, error: str | None = None) -> str:
    """The ``WWW-Authenticate`` value of a 401 at ``/mcp/`` (RFC 6750, RFC 9728)."""
    parts = ['Bearer realm="pippa"']
    if error:
        parts.append(f'error="{error}"')
    parts.append(f'resource_metadata="{resource_metadata_url(base)}"')
    parts.append(f'scope="{SCOPE}"')
    return ", ".join(parts)


# -- clients: signed metadata, no rows ----------------------------------------


def _client_secret(client_id: str) -> str:
    return salted_hmac(
        "pippa.oauth.client-secret", client_id, algorithm="sha256"
    ).hexdigest()


def _redirect_allowed(uri: str) -> bool:
    parts = urlsplit(uri)
    if parts.fragment or not parts.hostname:
        return False
    if parts.scheme == "https":
        return True
    return parts.scheme == "http" and parts.hostname.lower() in LOOPBACK_HOSTS


def redirect_shown(uri: str) -> str:
    """Where a sign-in's answer goes, as the consent page shows it: scheme, host, port."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}"


def client_register(info: OAuthClientInformationFull) -> None:
    """Give a client its id (its metadata, signed) and secret (an HMAC of the id).

    Refused: more than ``MAX_REDIRECT_URIS`` redirect URIs, one that is not
    https or loopback http, metadata over ``MAX_CLIENT_BYTES``. The SDK's
    handler answers with ``info`` as it is after this (RFC 7591 §3.2.1).
    """
    uris = [str(u) for u in info.redirect_uris or []]
    if len(uris) > MAX_REDIRECT_URIS:
        raise RegistrationError("invalid_redirect_uri", ERR_TOO_MANY_REDIRECTS)
    for uri in uris:
        if not _redirect_allowed(uri):
            raise RegistrationError(
                "invalid_redirect_uri", ERR_REDIRECT.format(uri=uri[:200])
            )
    method = info.token_endpoint_auth_method or "client_secret_post"
    if method not in AUTH_METHODS:
        raise RegistrationError(
            "invalid_client_metadata",
            f"token_endpoint_auth_method must be one of {', '.join(AUTH_METHODS)}",
        )
    doc = {
        "n": (info.client_name or "An MCP client")[:MAX_CLIENT_NAME],
        "r": uris,
        "m": method,
        "g": list(info.grant_types),
        "t": list(info.response_types),
        "s": info.scope or SCOPE,
        "i": info.client_id_issued_at or int(time.time()),
    }
    client_id = _clients.sign_object(doc, compress=True)
    if len(client_id) > MAX_CLIENT_BYTES:
        raise RegistrationError("invalid_client_metadata", ERR_CLIENT_TOO_LARGE)
    info.client_id = client_id
    info.client_secret = None if method == "none" else _client_secret(client_id)
    info.client_secret_expires_at = None if method == "none" else 0
    info.token_endpoint_auth_method = method


def client_get(client_id: str) -> OAuthClientInformationFull | None:
    """The client a signed id names, or None for an id this site did not sign."""
    if not client_id or len(client_id) > MAX_CLIENT_BYTES:
        return None
    try:
        doc = _clients.unsign_object(client_id)
    except (signing.BadSignature, ValueError):
        return None
    method = doc["m"]
    return OAuthClientInformationFull(
        client_id=client_id,
        client_secret=None if method == "none" else _client_secret(client_id),
        client_secret_expires_at=None if method == "none" else 0,
        client_id_issued_at=doc["i"],
        client_name=doc["n"],
        redirect_uris=doc["r"],
        token_endpoint_auth_method=method,
        grant_types=doc["g"],
        response_types=doc["t"],
        scope=doc["s"],
    )


# -- consent and code -----------------------------------------------------------


def consent_request(
    client: OAuthClientInformationFull, params: AuthorizationParams, *, base: str
) -> str:
    """The consent page's address for this authorization request (signed, timed).

    A ``resource`` other than this site's ``/mcp/`` is refused (RFC 8707's
    ``invalid_target``); none given means ``/mcp/``, the one resource here.
    """
    expected = mcp_resource(base)
    if params.resource and not same_resource(params.resource, expected):
        raise AuthorizeError(
            "invalid_target",
            ERR_RESOURCE.format(expected=expected, given=params.resource[:200]),
        )
    doc = {
        "c": client.client_id,
        "n": client.client_name or "An MCP client",
        "r": str(params.redirect_uri),
        "x": params.redirect_uri_provided_explicitly,
        "ch": params.code_challenge,
        "st": params.state,
        "s": params.scopes or [SCOPE],
        "res": expected,
    }
    signed = _consents.sign_object(doc, compress=True)
    return f"{reverse('oauth:consent')}?{urlencode({'request': signed})}"


def consent_read(signed: str) -> dict[str, Any] | None:
    """The authorization request of a consent page, or None once stale or forged."""
    if not signed or len(signed) > 4 * MAX_CLIENT_BYTES:
        return None
    try:
        return _consents.unsign_object(signed, max_age=CONSENT_SECONDS)
    except (signing.BadSignature, ValueError):
        return None


def consent_answer(
    consent: dict[str, Any], *, base: str, user=None, days: int | None = None
) -> str:
    """Where the browser goes after the person answered: the client's redirect
    URI with a code (``user`` allowed, for ``days``) or ``access_denied``.

    RFC 9207: the answer names this issuer (``iss``), so a client talking to
    several servers knows which one answered.
    """
    if user is None:
        return construct_redirect_uri(
            consent["r"],
            error="access_denied",
            error_description="the person declined the sign-in",
            state=consent["st"],
            iss=base,
        )
    code = _codes.sign_object(
        {
            "u": user.pk,
            "c": consent["c"],
            "n": consent["n"],
            "r": consent["r"],
            "x": consent["x"],
            "ch": consent["ch"],
            "s": consent["s"],
            "res": consent["res"],
            "d": days,
            "e": time.time() + CODE_SECONDS,
            "id": secrets.token_hex(16),
        },
        compress=True,
    )
    return construct_redirect_uri(
        consent["r"], code=code, state=consent["st"], iss=base
    )


class PippaCode(AuthorizationCode):
    user_id: int
    code_id: str
    days: int
    client_name: str


class PippaRefresh(RefreshToken):
    grant_id: int


class PippaAccess(AccessToken):
    grant_id: int


def code_read(client: OAuthClientInformationFull, code: str) -> PippaCode | None:
    """The authorization code ``client`` presents, or None (forged, or another's)."""
    if not code or len(code) > 4 * MAX_CLIENT_BYTES:
        return None
    try:
        doc = _codes.unsign_object(code)
    except (signing.BadSignature, ValueError):
        return None
    if doc["c"] != client.client_id:
        return None
    return PippaCode(
        code=code,
        scopes=doc["s"],
        expires_at=doc["e"],
        client_id=client.client_id,
        code_challenge=doc["ch"],
        redirect_uri=doc["r"],
        redirect_uri_provided_explicitly=doc["x"],
        resource=doc["res"],
        subject=str(doc["u"]),
        user_id=doc["u"],
        code_id=doc["id"],
        days=doc["d"],
        client_name=doc["n"],
    )


# -- grants: the user's rows ------------------------------------------------------


def _tokens(grant: OAuthGrant, access: str, refresh: str) -> OAuthToken:
    return OAuthToken(
        access_token=access,
        token_type="Bearer",
        expires_in=max(
            1, int((grant.access_expires_at - timezone.now()).total_seconds())
        ),
        scope=grant.scope,
        refresh_token=refresh,
    )


def _new_tokens(grant_end) -> dict[str, Any]:
    """A fresh access and refresh token: the raw pair and the columns that hold their hashes."""
    access = ACCESS_PREFIX + secrets.token_urlsafe(32)
    refresh = REFRESH_PREFIX + secrets.token_urlsafe(32)
    lifetime = timedelta(seconds=settings.PIPPA_OAUTH_ACCESS_SECONDS)
    return {
        "raw": (access, refresh),
        "access_sha256": token_hash(access),
        "access_expires_at": min(timezone.now() + lifetime, grant_end),
        "refresh_sha256": token_hash(refresh),
    }


def grant_from_code(code: PippaCode) -> OAuthToken:
    """Exchange an authorization code: the grant, and its first pair of tokens."""
    user = get_user_model().objects.filter(pk=code.user_id, is_active=True).first()
    if user is None:
        raise TokenError("invalid_grant", ERR_USER_GONE)
    end = timezone.now() + timedelta(days=code.days)
    fresh = _new_tokens(end)
    access, refresh = fresh.pop("raw")
    try:
        with transaction.atomic():
            grant = OAuthGrant.objects.create(
                user=user,
                client_name=code.client_name,
                client_id=code.client_id,
                scope=" ".join(code.scopes),
                resource=code.resource or "",
                code_id=code.code_id,
                expires_at=end,
                **fresh,
            )
    except IntegrityError:
        # RFC 6749 §4.1.2: a code used twice revokes what it was first used for.
        OAuthGrant.objects.filter(code_id=code.code_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        raise TokenError("invalid_grant", ERR_CODE_USED) from None
    return _tokens(grant, access, refresh)


def refresh_read(client: OAuthClientInformationFull, raw: str) -> PippaRefresh | None:
    """The grant a refresh token stands for, if ``client`` holds it and it is live.

    A refresh token that a refresh already replaced revokes its grant: two
    holders of one sign-in means a copy leaked (OAuth 2.1 §4.3.1).
    """
    if not raw.startswith(REFRESH_PREFIX) or len(raw) > TOKEN_RAW_MAX:
        return None
    sha = token_hash(raw)
    grant = OAuthGrant.objects.filter(refresh_sha256=sha).first()
    if grant is None:
        OAuthGrant.objects.filter(
            replaced_refresh_sha256=sha, revoked_at__isnull=True
        ).update(revoked_at=timezone.now())
        return None
    if not grant.is_active or grant.client_id != client.client_id:
        return None
    return PippaRefresh(
        token=raw,
        client_id=client.client_id,
        scopes=grant.scope.split(),
        expires_at=int(grant.expires_at.timestamp()),
        resource=grant.resource or None,
        subject=str(grant.user_id),
        grant_id=grant.pk,
    )


def grant_refresh(refresh: PippaRefresh) -> OAuthToken:
    """Rotate both tokens of a grant; the refresh token presented is spent."""
    grant = OAuthGrant.objects.get(pk=refresh.grant_id)
    fresh = _new_tokens(grant.expires_at)
    access, new_refresh = fresh.pop("raw")
    spent = token_hash(refresh.token)
    updated = OAuthGrant.objects.filter(
        pk=grant.pk,
        refresh_sha256=spent,
        revoked_at__isnull=True,
        expires_at__gt=timezone.now(),
    ).update(replaced_refresh_sha256=spent, **fresh)
    if not updated:
        raise TokenError("invalid_grant", ERR_REFRESH_USED)
    grant.refresh_from_db()
    return _tokens(grant, access, new_refresh)


def _live_grant(raw: str) -> OAuthGrant | None:
    if not raw.startswith(ACCESS_PREFIX) or len(raw) > TOKEN_RAW_MAX:
        return None
    now = timezone.now()
    return (
        OAuthGrant.objects.select_related("user")
        .filter(
            access_sha256=token_hash(raw),
            revoked_at__isnull=True,
            expires_at__gt=now,
            access_expires_at__gt=now,
        )
        .first()
    )


def access_read(raw: str) -> PippaAccess | None:
    grant = _live_grant(raw)
    if grant is None:
        return None
    return PippaAccess(
        token=raw,
        client_id=grant.client_id,
        scopes=grant.scope.split(),
        expires_at=int(grant.access_expires_at.timestamp()),
        resource=grant.resource or None,
        subject=str(grant.user_id),
        grant_id=grant.pk,
    )


def access_user(*, raw: str, resource: str):
    """The user of a live access token issued for ``resource``, or None.

    Records when the grant was last used (at most one write a minute).
    """
    grant = _live_grant(raw)
    if grant is None or not grant.user.is_active:
        return None
    if not same_resource(grant.resource, resource):
        return None
    now = timezone.now()
    if grant.last_used_at is None or (now - grant.last_used_at).total_seconds() > 60:
        OAuthGrant.objects.filter(pk=grant.pk).update(last_used_at=now)
    return grant.user


def mcp_token_user(*, raw: str, resource: str):
    """The user of a bearer token at ``/mcp/``: a static API token, or an
    access token issued for this server's ``/mcp/``."""
    if raw.startswith(ACCESS_PREFIX):
        return access_user(raw=raw, resource=resource)
    return token_authenticate(raw=raw)


def grant_revoke(*, grant: OAuthGrant) -> bool:
    """Revoke a sign-in: its access and refresh tokens stop at once."""
    return bool(
        OAuthGrant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    )


# -- the provider the SDK's handlers call ------------------------------------------


class PippaOAuthProvider:
    """``mcp.server.auth.provider.OAuthAuthorizationServerProvider`` over the
    functions above, for one request to this site at ``base``."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return client_get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        client_register(client_info)

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        return consent_request(client, params, base=self.base)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> PippaCode | None:
        return code_read(client, authorization_code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: PippaCode
    ) -> OAuthToken:
        return await sync_to_async(grant_from_code)(authorization_code)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> PippaRefresh | None:
        return await sync_to_async(refresh_read)(client, refresh_token)

    async def exchange_refresh_token(
        self,
        client: OAuthClientInformationFull,
        refresh_token: PippaRefresh,
        scopes: list[str],
    ) -> OAuthToken:
        return await sync_to_async(grant_refresh)(refresh_token)

    async def load_access_token(self, token: str) -> PippaAccess | None:
        return await sync_to_async(access_read)(token)

    async def revoke_token(self, token: PippaAccess | PippaRefresh) -> None:
        grant = await OAuthGrant.objects.filter(pk=token.grant_id).afirst()
        if grant is not None:
            await sync_to_async(grant_revoke)(grant=grant)

    async def exchange_identity_assertion(self, client, params) -> OAuthToken:
        raise TokenError(
            "unsupported_grant_type", "only authorization_code and refresh_token"
        )
