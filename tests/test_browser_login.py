"""A person opening the site in a real browser is asked to log in, and can."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_visitor_is_sent_to_the_login_page_and_can_log_in(
    page, live_server, make_user, screenshot
):
    make_user(username="dad")
    page.goto(f"{live_server.url}/")
    assert page.url.startswith(f"{live_server.url}/login/")
    assert page.get_by_role("heading", name="Log in").is_visible()
    screenshot(page, "login")
    page.fill("#id_username", "dad")
    page.fill("#id_password", "correct horse battery staple")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    assert page.get_by_role("heading", name="Conversations").is_visible()
    assert page.get_by_role("button", name="Log out dad").is_visible()
