"""MCP clients sign in through the browser: metadata, registration, consent,
codes with PKCE, short-lived access tokens bound to /mcp/, refresh, revocation.

The client speaks with Django's test client as any HTTP client would; the
person is a second, logged-in test client that answers the consent page.
"""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from api.models import OAuthGrant
from api.oauth import access_user, mcp_token_user
from api.services import token_create
from tests.support.oauth import (
    REDIRECT,
    Pkce,
    authorize_url,
    consent,
    register,
    sign_in,
    token,
)

pytestmark = pytest.mark.django_db

MCP = "http://testserver/mcp/"


@pytest.fixture
def person(user):
    browser = Client()
    browser.force_login(user)
    return browser


def _exchange(client, info, answer, pkce, **extra):
    return token(
        client,
        info,
        grant_type="authorization_code",
        code=answer["code"],
        redirect_uri=info["redirect_uris"][0],
        code_verifier=pkce.verifier,
        **extra,
    )


# -- metadata --------------------------------------------------------------------


def test_the_protected_resource_metadata_names_mcp_and_its_issuer_at_both_addresses(
    client,
):
    for path in (
        "/.well-known/oauth-protected-resource/mcp/",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ):
        response = client.get(path, headers={"Origin": "http://localhost:6274"})
        assert response.status_code == 200, path
        assert response["Content-Type"] == "application/json"
        # A client in a browser (the Inspector) may read it.
        assert response["Access-Control-Allow-Origin"] == "*"
        assert response.json() == {
            "resource": MCP,
            "authorization_servers": ["http://testserver"],
            "scopes_supported": ["tasks"],
            "bearer_methods_supported": ["header"],
            "resource_name": "Pippa Stateful",
        }


def test_the_authorization_server_metadata_says_pkce_s256_and_every_endpoint(client):
    meta = client.get("/.well-known/oauth-authorization-server").json()

    assert meta["issuer"] == "http://testserver"
    assert meta["authorization_endpoint"] == "http://testserver/oauth/authorize/"
    assert meta["token_endpoint"] == "http://testserver/oauth/token/"
    assert meta["registration_endpoint"] == "http://testserver/oauth/register/"
    assert meta["revocation_endpoint"] == "http://testserver/oauth/revoke/"
    assert meta["code_challenge_methods_supported"] == ["S256"]
    assert meta["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert "none" in meta["token_endpoint_auth_methods_supported"]
    assert meta["authorization_response_iss_parameter_supported"] is True


def test_the_metadata_follows_the_host_the_client_used(client, settings):
    settings.ALLOWED_HOSTS = ["pippa.example.org"]
    meta = client.get(
        "/.well-known/oauth-protected-resource/mcp/", HTTP_HOST="pippa.example.org"
    ).json()
    assert meta["resource"] == "http://pippa.example.org/mcp/"
    refused = client.get(
        "/.well-known/oauth-protected-resource/mcp/", HTTP_HOST="evil.example"
    )
    assert refused.status_code == 400


# -- registration --------------------------------------------------------------------


def test_registration_writes_no_row_and_its_client_id_is_refused_when_forged(client):
    info = register(client, method="client_secret_post")

    assert info["client_name"] == "Claude Code"
    assert info["client_secret"]
    assert info["client_secret_expires_at"] == 0
    assert not OAuthGrant.objects.exists()
    forged = info["client_id"][:-4] + "AAAA"
    pkce = Pkce.new()
    response = client.get(authorize_url({**info, "client_id": forged}, pkce))
    assert response.status_code == 400
    assert "not found" in response.json()["error_description"]


@pytest.mark.parametrize(
    "uri",
    [
        "http://attacker.example/callback",
        "javascript:alert(1)",
        "https://example.org/cb#fragment",
    ],
)
def test_a_redirect_uri_off_this_machine_over_plain_http_is_refused(client, uri):
    response = client.post(
        "/oauth/register/",
        json.dumps({"redirect_uris": [uri], "client_name": "x"}),
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json()["error"] in (
        "invalid_redirect_uri",
        "invalid_client_metadata",
    )


# -- consent ------------------------------------------------------------------------------


def test_a_person_not_logged_in_logs_in_first_and_the_sign_in_waits(client, user):
    info = register(client)
    pkce = Pkce.new()
    browser = Client()
    to_consent = browser.get(authorize_url(info, pkce))["Location"]

    login = browser.get(to_consent)
    assert login.status_code == 302
    assert login["Location"].startswith("/login/?next=")
    next_url = parse_qs(urlsplit(login["Location"]).query)["next"][0]
    assert next_url == to_consent
    browser.force_login(user)
    page = browser.get(next_url)
    assert page.status_code == 200
    assert "Claude Code wants to read and run your tasks" in page.content.decode()


def test_the_consent_page_lets_the_answer_redirect_to_the_client_only(client, person):
    info = register(client)
    to_consent = person.get(authorize_url(info, Pkce.new()))["Location"]
    page = person.get(to_consent)

    policy = page["Content-Security-Policy"]
    assert "form-action 'self' http://127.0.0.1:33418" in policy
    assert "frame-ancestors 'none'" in policy
    body = page.content.decode()
    assert "http://127.0.0.1:33418" in body
    assert 'value="30" selected' in body


def test_allowing_sends_a_code_with_the_state_and_the_issuer(client, person, user):
    info = register(client)
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce, state="xyz"), days=7)

    assert answer["state"] == "xyz"
    assert answer["iss"] == "http://testserver"
    status, tokens = _exchange(client, info, answer, pkce, resource=MCP)
    assert status == 200, tokens
    assert tokens["token_type"] == "Bearer"
    assert tokens["scope"] == "tasks"
    assert 0 < tokens["expires_in"] <= 3600
    grant = OAuthGrant.objects.get()
    assert grant.user == user
    assert grant.client_name == "Claude Code"
    assert grant.resource == MCP
    assert timedelta(days=6) < grant.expires_at - timezone.now() <= timedelta(days=7)
    # Only hashes are kept.
    stored = json.dumps(list(OAuthGrant.objects.values()), default=str)
    assert tokens["access_token"] not in stored
    assert tokens["refresh_token"] not in stored


def test_denying_sends_access_denied_and_makes_nothing(client, person):
    info = register(client)
    answer = consent(person, authorize_url(info, Pkce.new()), decision="deny")

    assert answer["error"] == "access_denied"
    assert answer["state"] == "s1"
    assert not OAuthGrant.objects.exists()


def test_a_stale_or_forged_consent_request_is_refused_with_a_sentence(person):
    response = person.get("/oauth/consent/?request=forged")
    assert response.status_code == 400
    assert "Start the sign-in again" in response.content.decode()


def test_a_sign_in_length_not_offered_is_refused(client, person):
    info = register(client)
    to_consent = person.get(authorize_url(info, Pkce.new()))["Location"]
    signed = parse_qs(urlsplit(to_consent).query)["request"][0]
    response = person.post(
        "/oauth/consent/", {"request": signed, "decision": "allow", "days": "9999"}
    )
    assert response.status_code == 400
    assert not OAuthGrant.objects.exists()


def test_a_token_for_another_resource_is_refused_as_invalid_target(client, person):
    info = register(client)
    response = person.get(
        authorize_url(info, Pkce.new(), resource="https://other.example/mcp")
    )
    assert response.status_code == 302
    back = parse_qs(urlsplit(response["Location"]).query)
    assert response["Location"].startswith(REDIRECT)
    assert back["error"] == ["invalid_target"]


def test_a_plain_challenge_method_is_refused(client, person):
    info = register(client)
    response = person.get(
        authorize_url(info, Pkce.new(), code_challenge_method="plain")
    )
    back = parse_qs(urlsplit(response["Location"]).query)
    assert back["error"] == ["invalid_request"]


# -- the code ----------------------------------------------------------------------------


def test_a_wrong_code_verifier_gets_no_token(client, person):
    info = register(client)
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce))
    status, body = _exchange(client, info, answer, Pkce.new())

    assert status == 400
    assert body["error"] == "invalid_grant"
    assert not OAuthGrant.objects.exists()


def test_a_code_used_twice_is_refused_and_revokes_what_it_made(client, person):
    info = register(client)
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce))
    _, first = _exchange(client, info, answer, pkce)
    status, second = _exchange(client, info, answer, pkce)

    assert status == 400
    assert second["error"] == "invalid_grant"
    assert "already exchanged" in second["error_description"]
    assert access_user(raw=first["access_token"], resource=MCP) is None


def test_another_clients_code_is_refused(client, person):
    info = register(client)
    other = register(client, name="Other")
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce))
    status, body = _exchange(client, other, answer, pkce)

    assert status == 400
    assert body["error"] == "invalid_grant"


def test_an_expired_code_is_refused(client, person, monkeypatch):
    info = register(client)
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce))
    monkeypatch.setattr("time.time", lambda: 4_000_000_000.0)
    status, body = _exchange(client, info, answer, pkce)

    assert status == 400
    assert "expired" in body["error_description"]


def test_a_confidential_client_must_send_its_secret(client, person):
    info = register(client, method="client_secret_post")
    pkce = Pkce.new()
    answer = consent(person, authorize_url(info, pkce))
    status, body = _exchange(client, {**info, "client_secret": "wrong"}, answer, pkce)
    assert status == 401
    assert body["error"] == "invalid_client"
    status, _ = _exchange(client, info, answer, pkce)
    assert status == 200


# -- access tokens: audience, expiry, refresh ---------------------------------------------


def test_an_access_token_is_good_for_this_mcp_server_only(client, person, user):
    _, tokens = sign_in(client, person)
    raw = tokens["access_token"]

    assert mcp_token_user(raw=raw, resource=MCP) == user
    assert mcp_token_user(raw=raw, resource="http://testserver/mcp") == user
    assert mcp_token_user(raw=raw, resource="http://elsewhere/mcp/") is None
    # The JSON API takes static tokens only.
    response = client.get(
        "/api/v1/conversations", headers={"Authorization": f"Bearer {raw}"}
    )
    assert response.status_code == 401


def test_an_expired_access_token_is_refused_and_its_refresh_works(client, person, user):
    info, tokens = sign_in(client, person)
    OAuthGrant.objects.update(access_expires_at=timezone.now() - timedelta(seconds=1))

    assert mcp_token_user(raw=tokens["access_token"], resource=MCP) is None
    status, fresh = token(
        client, info, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )
    assert status == 200, fresh
    assert fresh["access_token"] != tokens["access_token"]
    assert fresh["refresh_token"] != tokens["refresh_token"]
    assert mcp_token_user(raw=fresh["access_token"], resource=MCP) == user


def test_a_refresh_token_used_twice_signs_the_grant_out(client, person):
    info, tokens = sign_in(client, person)
    _, fresh = token(
        client, info, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )
    status, body = token(
        client, info, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )

    assert status == 400
    assert body["error"] == "invalid_grant"
    # Two holders of one sign-in: a copy leaked, so the sign-in ends.
    assert mcp_token_user(raw=fresh["access_token"], resource=MCP) is None
    assert OAuthGrant.objects.get().revoked_at is not None


def test_no_refresh_reaches_past_the_end_the_person_chose(client, person):
    info, tokens = sign_in(client, person, days=1)
    OAuthGrant.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    status, body = token(
        client, info, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )
    assert status == 400
    assert body["error"] == "invalid_grant"


def test_another_client_cannot_use_a_refresh_token(client, person):
    _, tokens = sign_in(client, person)
    other = register(client, name="Other")
    status, _ = token(
        client, other, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )
    assert status == 400


def test_a_deactivated_person_signs_their_apps_out(client, person, user):
    _, tokens = sign_in(client, person)
    user.is_active = False
    user.save()
    assert mcp_token_user(raw=tokens["access_token"], resource=MCP) is None


# -- revocation ------------------------------------------------------------------------------


def test_a_client_revoking_its_refresh_token_stops_its_access_token_too(client, person):
    info, tokens = sign_in(client, person)
    response = client.post(
        "/oauth/revoke/",
        f"token={tokens['refresh_token']}&client_id={info['client_id']}",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 200
    assert mcp_token_user(raw=tokens["access_token"], resource=MCP) is None


def test_a_client_revoking_its_access_token_ends_the_sign_in(client, person):
    info, tokens = sign_in(client, person)
    client.post(
        "/oauth/revoke/",
        f"token={tokens['access_token']}&client_id={info['client_id']}",
        content_type="application/x-www-form-urlencoded",
    )
    status, _ = token(
        client, info, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )
    assert status == 400


def test_the_tokens_page_lists_sign_ins_and_signs_one_out(client, person, user):
    info, tokens = sign_in(client, person)
    static = token_create(user=user, name="script")
    page = person.get("/settings/tokens/").content.decode()
    assert "Signed-in apps" in page
    assert "Claude Code" in page
    assert "script" in page
    grant = OAuthGrant.objects.get()

    asked = person.get(f"/settings/tokens/sign-ins/{grant.pk}/revoke/")
    assert "Sign out “<bdi>Claude Code</bdi>”?" in asked.content.decode()
    done = person.post(f"/settings/tokens/sign-ins/{grant.pk}/revoke/", follow=True)
    assert "Claude Code is signed out" in done.content.decode()
    assert mcp_token_user(raw=tokens["access_token"], resource=MCP) is None
    status, _ = token(
        client, info, grant_type="refresh_token", refresh_token=tokens["refresh_token"]
    )
    assert status == 400
    # The static token is untouched.
    assert mcp_token_user(raw=static.raw, resource=MCP) == user


def test_nobody_sees_or_signs_out_another_persons_sign_in(client, person, make_user):
    sign_in(client, person, name="Dad's agent")
    grant = OAuthGrant.objects.get()
    mallory = Client()
    mallory.force_login(make_user(username="mallory"))

    assert "Dad&#x27;s agent" in person.get("/settings/tokens/").content.decode()
    assert "Dad&#x27;s agent" not in mallory.get("/settings/tokens/").content.decode()
    assert (
        mallory.get(f"/settings/tokens/sign-ins/{grant.pk}/revoke/").status_code == 404
    )
    assert (
        mallory.post(f"/settings/tokens/sign-ins/{grant.pk}/revoke/").status_code == 404
    )
    assert OAuthGrant.objects.get().revoked_at is None
