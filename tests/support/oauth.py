"""Signing an MCP client in, as a client and its person would (tests only).

``register`` and ``token`` speak to the authorization server like any HTTP
client; ``consent`` is the person: a logged-in Django test client that
follows the authorization URL to the consent page and answers it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

REDIRECT = "http://127.0.0.1:33418/callback"


@dataclass
class Pkce:
    verifier: str
    challenge: str

    @classmethod
    def new(cls) -> Pkce:
        verifier = secrets.token_urlsafe(48)
        digest = hashlib.sha256(verifier.encode()).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).decode().rstrip("="))


def register(client, *, name="Claude Code", redirect=REDIRECT, method="none") -> dict:
    """Register a client (RFC 7591) through ``client``; return its information."""
    response = client.post(
        "/oauth/register/",
        json.dumps(
            {
                "client_name": name,
                "redirect_uris": [redirect],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": method,
            }
        ),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def authorize_url(info: dict, pkce: Pkce, *, state="s1", resource=None, **extra) -> str:
    params = {
        "response_type": "code",
        "client_id": info["client_id"],
        "redirect_uri": info["redirect_uris"][0],
        "code_challenge": pkce.challenge,
        "code_challenge_method": "S256",
        "state": state,
        "resource": resource or "http://testserver/mcp/",
        **extra,
    }
    return "/oauth/authorize/?" + urlencode(params)


def consent(person, url: str, *, decision="allow", days=30) -> dict:
    """Follow ``url`` to the consent page as ``person`` (logged in) and answer it.

    Returns the query of the redirect back to the client (code, state, iss;
    or error).
    """
    page = person.get(url)
    assert page.status_code == 302, page.content
    consent_url = page["Location"]
    assert consent_url.startswith("/oauth/consent/")
    shown = person.get(consent_url)
    assert shown.status_code == 200, shown.content
    signed = parse_qs(urlsplit(consent_url).query)["request"][0]
    answer = person.post(
        "/oauth/consent/", {"request": signed, "decision": decision, "days": days}
    )
    assert answer.status_code == 302, answer.content
    back = urlsplit(answer["Location"])
    return {k: v[0] for k, v in parse_qs(back.query).items()}


def token(client, info: dict, **form) -> tuple[int, dict]:
    """POST the token endpoint as the client (its id, and its secret if it has one)."""
    data = {"client_id": info["client_id"], **form}
    if info.get("client_secret"):
        data["client_secret"] = info["client_secret"]
    response = client.post(
        "/oauth/token/",
        urlencode(data),
        content_type="application/x-www-form-urlencoded",
    )
    return response.status_code, response.json()


def sign_in(client, person, *, name="Claude Code", days=30) -> tuple[dict, dict]:
    """The whole flow: register, consent, exchange. Returns (client info, tokens)."""
    info = register(client, name=name)
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce), days=days)
    status, tokens = token(
        client,
        info,
        grant_type="authorization_code",
        code=answer["code"],
        redirect_uri=info["redirect_uris"][0],
        code_verifier=pkce.verifier,
        resource="http://testserver/mcp/",
    )
    assert status == 200, tokens
    return info, tokens


def consent_path(*, name: str = "Claude Code", state="s", base="http://testserver"):
    """A registered client and the address of its consent page (the services a
    browser sign-in goes through, without HTTP)."""
    from mcp.server.auth.provider import AuthorizationParams
    from mcp.shared.auth import OAuthClientInformationFull

    from api import oauth

    info = OAuthClientInformationFull(
        client_id="pending",
        client_name=name,
        redirect_uris=[REDIRECT],
        token_endpoint_auth_method="none",
    )
    oauth.client_register(info)
    params = AuthorizationParams(
        state=state,
        scopes=None,
        code_challenge=Pkce.new().challenge,
        redirect_uri=REDIRECT,
        redirect_uri_provided_explicitly=True,
        resource=oauth.mcp_resource(base),
    )
    return info, oauth.consent_request(info, params, base=base)


def grant_for(
    user, *, name: str = "Claude Code", days: int = 30, base="http://testserver"
):
    """A sign-in of ``user`` made by the services a browser sign-in goes
    through (registration, consent, code, exchange), without HTTP; returns
    the tokens."""
    from api import oauth

    info, path = consent_path(name=name, base=base)
    asked = oauth.consent_read(parse_qs(urlsplit(path).query)["request"][0])
    back = oauth.consent_answer(asked, base=base, user=user, days=days)
    code = parse_qs(urlsplit(back).query)["code"][0]
    return oauth.grant_from_code(oauth.code_read(info, code))
