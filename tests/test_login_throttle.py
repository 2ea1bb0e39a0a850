"""Login throttling (django-axes): the dashboard and admin logins lock a name
tried from one address after too many wrong passwords, and recover after the
cool-off or an operator's reset; failing API tokens are throttled the same way.

Lockouts cannot lock Dad out: trying again during a lockout does not extend
it, a valid token always answers, and every 429 says when to come back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.db.models import F
from django.utils import timezone

from api.services import token_create
from pippa_site.throttle import API_TOKEN_NAME

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
LOGINS = {"dashboard": "/login/", "admin": "/admin/login/"}


@pytest.fixture(autouse=True)
def _policy(settings):
    settings.AXES_FAILURE_LIMIT = 5
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)


def _login(client, url, username, password):
    return client.post(url, {"username": username, "password": password})


def _logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def _let_the_cooloff_pass():
    """Move every recorded failure back past the cool-off (time passing)."""
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(hours=1))


def _let_minutes_pass(minutes: int):
    """Move every recorded failure ``minutes`` into the past (time passing)."""
    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - timedelta(minutes=minutes)
    )


@pytest.mark.parametrize("door", sorted(LOGINS))
def test_fifty_wrong_passwords_lock_the_name_and_the_right_one_no_longer_gets_in(
    client, make_user, door
):
    make_user(username="dad", is_staff=True)
    url = LOGINS[door]
    answers = [_login(client, url, "dad", f"guess {i}").status_code for i in range(50)]

    assert answers[:4] == [200] * 4  # the form again, with its error
    assert set(answers[5:]) == {429}
    response = _login(client, url, "dad", PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert not _logged_in(client)


@pytest.mark.parametrize("door", sorted(LOGINS))
def test_a_locked_name_logs_in_again_after_the_cooloff(client, make_user, door):
    make_user(username="dad", is_staff=True)
    url = LOGINS[door]
    for i in range(5):
        _login(client, url, "dad", f"guess {i}")
    assert _login(client, url, "dad", PASSWORD).status_code == 429

    _let_the_cooloff_pass()

    assert _login(client, url, "dad", PASSWORD).status_code == 302
    assert _logged_in(client)


def test_an_operator_lifts_a_lockout_with_axes_reset_username(client, make_user):
    make_user(username="dad")
    for i in range(5):
        _login(client, "/login/", "dad", f"guess {i}")
    assert _login(client, "/login/", "dad", PASSWORD).status_code == 429

    call_command("axes_reset_username", "dad", verbosity=0)

    assert _login(client, "/login/", "dad", PASSWORD).status_code == 302


def test_a_good_login_clears_the_failures_before_the_limit(client, make_user):
    make_user(username="dad")
    for i in range(4):
        _login(client, "/login/", "dad", f"guess {i}")
    assert _login(client, "/login/", "dad", PASSWORD).status_code == 302
    client.logout()
    for i in range(4):
        assert _login(client, "/login/", "dad", f"again {i}").status_code == 200
    assert _login(client, "/login/", "dad", PASSWORD).status_code == 302


def test_a_stranger_guessing_one_name_does_not_lock_another_user(client, make_user):
    make_user(username="dad")
    make_user(username="mum")
    for i in range(6):
        _login(client, "/login/", "dad", f"guess {i}")
    assert _login(client, "/login/", "mum", PASSWORD).status_code == 302


def _api(client, raw):
    return client.get("/api/v1/conversations", HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_failed_api_tokens_are_throttled_and_recover_after_the_cooloff(client):
    answers = [_api(client, f"pip_wrong{i}").status_code for i in range(8)]

    assert answers[:4] == [401] * 4
    assert set(answers[4:]) == {429}  # the fifth failure locks
    locked = _api(client, "pip_wrong9")
    assert "too many failed API token attempts" in locked.json()["detail"]
    assert AccessAttempt.objects.filter(username=API_TOKEN_NAME).exists()

    _let_the_cooloff_pass()

    assert _api(client, "pip_wrong9").status_code == 401


def test_api_token_failures_count_per_address(client):
    for i in range(6):
        _api(client, f"pip_wrong{i}")
    here = _api(client, "pip_wrong7")
    elsewhere = client.get(
        "/api/v1/conversations",
        HTTP_AUTHORIZATION="Bearer pip_wrong7",
        REMOTE_ADDR="192.0.2.7",
    )
    assert here.status_code == 429
    assert elsewhere.status_code == 401


def test_a_valid_token_answers_while_its_address_is_locked_out(client, make_user):
    good = token_create(user=make_user(), name="runner").raw
    for i in range(6):
        _api(client, f"pip_wrong{i}")
    assert _api(client, "pip_wrong7").status_code == 429

    assert _api(client, good).status_code == 200
    # ... and clears nothing: the guesser is still locked out.
    assert _api(client, "pip_wrong8").status_code == 429


def test_a_good_token_does_not_reset_a_guessers_count(client, make_user):
    good = token_create(user=make_user(), name="runner").raw
    for i in range(4):
        assert _api(client, f"pip_wrong{i}").status_code == 401
    assert _api(client, good).status_code == 200

    # The fifth failure locks, the good token between them notwithstanding.
    assert _api(client, "pip_wrong4").status_code == 429


def test_a_wrong_password_during_a_lockout_does_not_extend_it(client, make_user):
    make_user(username="dad")
    for i in range(5):
        _login(client, "/login/", "dad", f"guess {i}")
    _let_minutes_pass(10)
    # Someone on the same address keeps trying while Dad is locked out.
    assert _login(client, "/login/", "dad", "guess again").status_code == 429
    _let_minutes_pass(6)

    assert _login(client, "/login/", "dad", PASSWORD).status_code == 302
    assert _logged_in(client)


def test_a_bad_token_during_a_lockout_does_not_extend_it(client):
    for i in range(5):
        _api(client, f"pip_wrong{i}")
    _let_minutes_pass(10)
    assert _api(client, "pip_wrong5").status_code == 429
    _let_minutes_pass(6)

    assert _api(client, "pip_wrong6").status_code == 401


@pytest.mark.parametrize("door", ["login", "api"])
def test_a_429_says_in_retry_after_how_long_the_lockout_still_lasts(
    client, make_user, door
):
    make_user(username="dad")

    def attempt():
        if door == "api":
            return _api(client, "pip_wrong")
        return _login(client, "/login/", "dad", "guess")

    for _ in range(5):
        attempt()
    first = attempt()
    _let_minutes_pass(10)
    later = attempt()

    assert first.status_code == later.status_code == 429
    assert 14 * 60 < int(first["Retry-After"]) <= 15 * 60
    assert 4 * 60 < int(later["Retry-After"]) <= 5 * 60
