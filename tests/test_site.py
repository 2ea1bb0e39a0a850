"""Settings from the environment, the login wall, and the deploy checklist."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.django_db
def test_the_home_page_asks_anonymous_visitors_to_log_in(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    page = client.get(response["Location"])
    assert page.status_code == 200
    assert b"Log in" in page.content


@pytest.mark.django_db
def test_every_page_carries_a_content_security_policy(client):
    response = client.get("/login/")
    csp = response["Content-Security-Policy"]
    assert "default-src 'self'" in csp
    assert "object-src 'none'" in csp
    assert "script-src 'self' 'nonce-" in csp


def _manage(args, env, python_exe):
    return subprocess.run(
        [python_exe, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_check_deploy_is_clean_under_production_settings(tmp_path, python_exe):
    env = {
        "PATH": "/usr/bin:/bin",
        "PIPPA_DATA_DIR": str(tmp_path),
        "SECRET_KEY": "a-long-random-production-secret-" + "x7Qp2v9Lm3" * 5,
        "ALLOWED_HOSTS": "pippa.example.org",
        "PIPPA_HTTPS": "1",
        "DEBUG": "0",
    }
    result = _manage(["check", "--deploy", "--fail-level", "WARNING"], env, python_exe)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.slow
def test_a_secret_key_is_generated_once_and_kept_in_the_data_dir(tmp_path, python_exe):
    env = {"PATH": "/usr/bin:/bin", "PIPPA_DATA_DIR": str(tmp_path)}
    code = [
        "shell",
        "-c",
        "from django.conf import settings; print(settings.SECRET_KEY)",
    ]
    first = _manage(code, env, python_exe)
    second = _manage(code, env, python_exe)
    assert first.returncode == 0, first.stderr
    key = (tmp_path / "secret_key").read_text().strip()
    assert len(key) >= 50
    assert first.stdout.split()[-1] == second.stdout.split()[-1] == key
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0


@pytest.mark.slow
def test_debug_is_off_unless_asked_for(tmp_path, python_exe):
    code = ["shell", "-c", "from django.conf import settings; print(settings.DEBUG)"]
    base = {"PATH": "/usr/bin:/bin", "PIPPA_DATA_DIR": str(tmp_path)}
    assert _manage(code, base, python_exe).stdout.split()[-1] == "False"
    assert (
        _manage(code, {**base, "DEBUG": "1"}, python_exe).stdout.split()[-1] == "True"
    )


@pytest.mark.slow
def test_a_non_postgres_database_url_is_refused_clearly(tmp_path, python_exe):
    env = {
        "PATH": "/usr/bin:/bin",
        "PIPPA_DATA_DIR": str(tmp_path),
        "DATABASE_URL": "mysql://x@y/z",
    }
    result = _manage(["check"], env, python_exe)
    assert result.returncode != 0
    assert "DATABASE_URL must point at PostgreSQL" in result.stderr


@pytest.mark.django_db
def test_bootstrap_creates_one_operator_and_is_harmless_twice(capsys, monkeypatch):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    monkeypatch.setenv("PIPPA_ADMIN_PASSWORD", "s3cret-operator-pass")
    call_command("pippa_bootstrap")
    call_command("pippa_bootstrap")
    users = get_user_model().objects.filter(is_superuser=True)
    assert users.count() == 1
    assert users.get().check_password("s3cret-operator-pass")
    assert capsys.readouterr().out.count("Created the operator account") == 1
