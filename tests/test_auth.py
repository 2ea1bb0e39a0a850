"""Sessions and the session's user: Django's database sessions and ModelBackend,
and a forged cookie that is no session on every database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import global_settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone


def _home(client):
    return client.get("/")


@pytest.mark.django_db
def test_a_logged_in_user_sees_their_dashboard(client, user):
    client.force_login(user)
    response = _home(client)
    assert response.status_code == 200
    assert response.wsgi_request.user == user


@pytest.mark.django_db
def test_an_expired_session_is_no_session(client, user):
    client.force_login(user)
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))
    response = _home(client)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.django_db
def test_a_deactivated_user_is_logged_out(client, user):
    client.force_login(user)
    user.is_active = False
    user.save()
    assert _home(client).status_code == 302


@pytest.mark.django_db
def test_a_copied_cookie_stops_working_after_logout(client, user):
    client.force_login(user)
    thief = Client()
    thief.cookies["sessionid"] = client.cookies["sessionid"].value
    assert _home(thief).status_code == 200
    client.post("/logout/")
    assert _home(thief).status_code == 302
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_a_password_change_ends_other_sessions(client, user):
    client.force_login(user)
    user.set_password("a-new-long-password-0123")
    user.save()
    assert _home(client).status_code == 302


@pytest.mark.django_db
@pytest.mark.parametrize(
    "cookie",
    ["x", "' OR 1=1 --", "a" * 40, "\x00" * 32, "ünïcødé-session-key-000000"],
)
def test_a_forged_session_cookie_is_anonymous_not_an_error(client, user, cookie):
    client.force_login(user)
    client.cookies["sessionid"] = cookie
    response = _home(client)
    assert response.status_code == 302
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_a_session_naming_a_missing_user_is_anonymous(client, user):
    backend = ModelBackend()
    assert backend.get_user(user.pk) == user
    assert backend.get_user(user.pk + 1000) is None
    client.force_login(user)
    user.delete()
    assert _home(client).status_code == 302


@pytest.mark.django_db
def test_the_store_reads_what_it_wrote_and_nothing_after_delete(user):
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store.save()
    again = SessionStore(store.session_key)
    assert again[SESSION_KEY] == str(user.pk)
    store.delete()
    gone = SessionStore(store.session_key)
    assert SESSION_KEY not in gone
    assert gone.session_key is None


@pytest.mark.django_db
def test_a_login_works_with_the_real_password_hasher(client, make_user, settings):
    """The other tests hash with MD5 for speed; this one uses what a site uses."""
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    user = make_user(username="real-hasher", password="a-long-real-password-0123")
    assert user.password.startswith("pbkdf2_sha256$")

    wrong = client.post(
        "/login/", {"username": "real-hasher", "password": "not-the-password"}
    )
    assert wrong.status_code == 200
    assert SESSION_KEY not in client.session

    right = client.post(
        "/login/", {"username": "real-hasher", "password": "a-long-real-password-0123"}
    )
    assert right.status_code == 302
    assert client.session[SESSION_KEY] == str(user.pk)
    assert _home(client).wsgi_request.user == user


@pytest.mark.django_db
def test_the_other_tests_hash_passwords_with_md5_for_speed(user):
    assert user.password.startswith("md5$")
