"""API tokens: made on the dashboard, shown once, stored hashed, expiring when
the person chose, revocable."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from api.models import ApiToken
from api.services import token_create, token_revoke

pytestmark = pytest.mark.django_db


def test_token_page_creates_a_token_and_shows_it_only_once(client, user):
    client.force_login(user)
    posted = client.post("/settings/tokens/new/", {"name": "codex on the laptop"})
    assert posted.status_code == 302  # POST-redirect-GET: a reload posts nothing
    assert posted["Location"] == "/settings/tokens/"
    response = client.get(posted["Location"])
    assert response["Cache-Control"].startswith("max-age=0")
    token = ApiToken.objects.get(user=user)
    raw = response.context["new_token"]
    assert raw.encode() in response.content
    assert raw.startswith(token.prefix)
    again = client.get("/settings/tokens/")  # the reload Dad makes
    assert raw.encode() not in again.content
    assert b"codex on the laptop" in again.content
    assert token.prefix.encode() in again.content
    assert ApiToken.objects.filter(user=user).count() == 1


def test_a_second_active_token_of_the_same_name_is_refused_but_not_for_another_user(
    client, user, make_user
):
    client.force_login(user)
    client.post("/settings/tokens/new/", {"name": "laptop"})
    response = client.post("/settings/tokens/new/", {"name": "laptop"})
    assert response.status_code == 400
    assert "you already have an active token named “laptop”" in (
        response.content.decode()
    )
    assert ApiToken.objects.filter(user=user).count() == 1
    other = make_user(username="other-token-user")
    token_create(user=other, name="laptop")  # names are per user
    # Once revoked, the name is free again.
    token_revoke(token=ApiToken.objects.get(user=user))
    assert client.post("/settings/tokens/new/", {"name": "laptop"}).status_code == 302
    assert ApiToken.objects.filter(user=user, name="laptop").count() == 2
    assert ApiToken.objects.filter(user=user, name="laptop").active().count() == 1


def test_the_database_refuses_two_active_tokens_of_one_name(user):
    from django.db import IntegrityError, transaction

    token_create(user=user, name="runner")
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiToken.objects.create(user=user, name="runner", sha256="b" * 64, prefix="p")


def test_only_the_sha256_of_a_token_is_stored(user):
    new = token_create(user=user, name="runner")
    row = ApiToken.objects.get(pk=new.token.pk)
    assert row.sha256 == hashlib.sha256(new.raw.encode()).hexdigest()
    stored = [
        str(v) for v in ApiToken.objects.filter(pk=row.pk).values().first().values()
    ]
    assert new.raw not in stored


def test_a_token_without_a_name_is_refused_with_a_reason(client, user):
    client.force_login(user)
    response = client.post("/settings/tokens/new/", {"name": "   "})
    assert response.status_code == 400
    assert b"give the token a name" in response.content
    assert not ApiToken.objects.exists()


def test_the_api_answers_401_with_a_reason_without_a_token(client):
    response = client.get("/api/v1/conversations")
    assert response.status_code == 401
    assert "Bearer" in response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_the_api_answers_401_for_a_made_up_token(client, user):
    token_create(user=user, name="real")
    response = client.get(
        "/api/v1/conversations", headers={"Authorization": "Bearer pip_made-up"}
    )
    assert response.status_code == 401


def test_a_token_works_until_it_is_revoked_on_the_dashboard(client, user):
    new = token_create(user=user, name="runner")
    headers = {"Authorization": f"Bearer {new.raw}"}
    assert client.get("/api/v1/conversations", headers=headers).status_code == 200
    client.force_login(user)
    response = client.post(f"/settings/tokens/{new.token.pk}/revoke/", follow=True)
    assert b"revoked" in response.content
    client.logout()
    assert client.get("/api/v1/conversations", headers=headers).status_code == 401
    assert ApiToken.objects.get(pk=new.token.pk).revoked_at is not None


def test_using_a_token_records_when_it_was_last_used(client, user):
    new = token_create(user=user, name="runner")
    assert new.token.last_used_at is None
    client.get("/api/v1/conversations", headers={"Authorization": f"Bearer {new.raw}"})
    assert ApiToken.objects.get(pk=new.token.pk).last_used_at is not None


def test_nobody_can_revoke_another_users_token(client, user, make_user):
    new = token_create(user=make_user(), name="theirs")
    client.force_login(user)
    response = client.post(f"/settings/tokens/{new.token.pk}/revoke/")
    assert response.status_code == 404
    assert ApiToken.objects.get(pk=new.token.pk).revoked_at is None


def test_revoking_twice_says_it_is_already_revoked(user):
    new = token_create(user=user, name="runner")
    token_revoke(token=new.token)
    with pytest.raises(ValueError, match="already revoked"):
        token_revoke(token=new.token)


def test_the_token_page_needs_a_login(client):
    response = client.get("/settings/tokens/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_staff_can_revoke_a_token_in_the_admin_but_not_create_one(client, make_user):
    staff = make_user(username="op", is_staff=True, is_superuser=True)
    new = token_create(user=make_user(), name="leaked")
    client.force_login(staff)
    assert client.get("/admin/api/apitoken/add/").status_code == 403
    response = client.post(
        "/admin/api/apitoken/",
        {"action": "revoke", "_selected_action": [new.token.pk]},
        follow=True,
    )
    assert b"Revoked 1 token" in response.content
    assert ApiToken.objects.get(pk=new.token.pk).revoked_at is not None


# -- expiry ---------------------------------------------------------------------------


def test_a_token_lasts_as_long_as_the_person_chose_on_the_page(client, user):
    client.force_login(user)
    page = client.get("/settings/tokens/").content.decode()
    assert '<option value="90" selected>in 90 days</option>' in page
    assert '<option value="never">never (until you revoke it)</option>' in page

    client.post("/settings/tokens/new/", {"name": "week", "days": "7"})
    client.post("/settings/tokens/new/", {"name": "forever", "days": "never"})
    week = ApiToken.objects.get(name="week")
    assert (
        timedelta(days=6, hours=23)
        < week.expires_at - timezone.now()
        <= timedelta(days=7)
    )
    assert ApiToken.objects.get(name="forever").expires_at is None


def test_a_length_the_page_does_not_offer_is_refused_and_makes_no_token(client, user):
    client.force_login(user)
    response = client.post("/settings/tokens/new/", {"name": "odd", "days": "3"})
    assert response.status_code == 400
    assert "choose how long the token lasts" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_an_expired_token_is_refused_and_listed_as_expired(client, user):
    new = token_create(user=user, name="old", days=7)
    headers = {"Authorization": f"Bearer {new.raw}"}
    assert client.get("/api/v1/conversations", headers=headers).status_code == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    response = client.get("/api/v1/conversations", headers=headers)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    client.force_login(user)
    page = client.get("/settings/tokens/").content.decode()
    assert ">expired</td>" in page


@pytest.mark.django_db
def test_the_token_page_shows_the_line_to_paste_for_each_agent_with_this_sites_address(
    client, user
):
    client.force_login(user)
    before = client.get("/settings/tokens/").content.decode()
    # Signing in through the browser: nothing to copy but the lines.
    assert (
        "claude mcp add --transport http pippa http://testserver/mcp/\n"
        "claude mcp login pippa</textarea>" in before
    )
    assert (
        "codex mcp add pippa --url http://testserver/mcp/\ncodex mcp login pippa"
        in before
    )
    assert (
        "gemini mcp add --scope user --transport http pippa http://testserver/mcp/"
        in before
    )
    # With a token: a placeholder until one is made.
    assert (
        "claude mcp add --transport http pippa http://testserver/mcp/"
        ' --header "Authorization: Bearer &lt;your token&gt;"' in before
    )

    page = client.post("/settings/tokens/new/", {"name": "laptop"}, follow=True)
    text = page.content.decode()
    token = page.context["new_token"]

    assert '<details id="agents-with-token" open>' in text
    assert (
        "claude mcp add --transport http pippa http://testserver/mcp/"
        f' --header "Authorization: Bearer {token}"' in text
    )
    assert (
        f'export PIPPA_API_TOKEN="{token}"\ncodex mcp add pippa'
        " --url http://testserver/mcp/ --bearer-token-env-var PIPPA_API_TOKEN" in text
    )
    assert (
        "gemini mcp add --scope user --transport http"
        f' --header "Authorization: Bearer {token}" pippa http://testserver/mcp/'
        in text
    )
    # Shown once: the next visit has the placeholder again.
    assert token not in client.get("/settings/tokens/").content.decode()
