"""One login check for every page a person signs in for (pippa_site.login).

An htmx request whose session ended (a card's poll, a button's swap) must get
a whole-page redirect to the login page (``HX-Redirect``), never the login
form swapped into a card. The walk reaches every URL pattern the site has, so
a new page that uses Django's plain ``login_required`` fails here.
"""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true", "HX-Current-URL": "http://testserver/somewhere/"}
SAMPLE = {"int": "1", "str": "x", "slug": "x", "path": "x", "uuid": "0" * 32}
# The admin signs staff in on its own page and sends no htmx; signing in and
# out are the login pages themselves (logging out lands on the login page).
NOT_WALKED = ("admin/", "login/", "logout/")


def _route(pattern) -> str | None:
    """A path that matches one pattern, its parameters filled with samples."""
    text = str(pattern.pattern)
    if hasattr(pattern.pattern, "_route"):
        return re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLE[m.group(1) or "str"], text)
    text = re.sub(r"\(\?:[^()]*\)\?", "", text).strip("^$")
    return (
        None
        if re.search(r"[()\[\]*+?|\\]", text.replace("\\.", ""))
        else (text.replace("\\.", "."))
    )


def _walk(patterns, prefix: str = ""):
    for pattern in patterns:
        part = _route(pattern)
        if part is None:
            continue
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + part)
        elif isinstance(pattern, URLPattern):
            yield "/" + prefix + part


def _paths() -> list[str]:
    paths = sorted(set(_walk(get_resolver().url_patterns)))
    return [p for p in paths if not p.lstrip("/").startswith(NOT_WALKED)]


def test_no_page_answers_an_htmx_request_without_a_session_with_the_login_form(
    client,
):
    login = reverse("login")
    swapped, redirected = [], set()
    for path in _paths():
        for method in (client.get, client.post):
            response = method(path, headers=HTMX)
            location = response.get("Location", "")
            if response.status_code in (301, 302) and location.startswith(login):
                swapped.append(f"{method.__name__.upper()} {path}")
            if response.get("HX-Redirect", "").startswith(f"{login}?next="):
                redirected.add(path)
    assert swapped == []
    # The walk reached the pages of every app a person signs in for.
    for page in (
        "/",
        "/council/rounds/1/",
        "/artifacts/1/",
        "/settings/notifications/",
        "/settings/tokens/",
        "/oauth/consent/",
    ):
        assert page in redirected, sorted(redirected)


def test_the_htmx_redirect_leads_back_to_the_page_the_request_came_from(client):
    response = client.get("/council/rounds/1/", headers=HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/login/?next=%2Fsomewhere%2F"
    assert b"Log in" not in response.content


def test_turning_messages_off_from_a_mail_needs_no_session(client):
    url = reverse("notify_off", args=["not-a-token"])
    for method in (client.get, client.post):
        response = method(url, headers=HTMX)
        assert "HX-Redirect" not in response
        assert response.status_code != 302
