"""The token page in a real browser: create (shown once), then revoke."""

from __future__ import annotations

import pytest

from pippa_site.models import ApiToken

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_token_is_created_shown_once_and_revoked_in_the_browser(
    logged_in_page, screenshot
):
    page = logged_in_page
    page.goto(f"{page.base_url}/settings/tokens/")
    page.fill("#token-name", "gemini runner")
    page.click("text=Create token")
    raw = page.input_value("#new-token")
    assert raw.startswith("pip_")
    screenshot(page, "api-tokens-created")
    page.goto(f"{page.base_url}/settings/tokens/")
    assert raw not in page.content()
    page.click("text=Revoke")
    assert (
        page.locator(".messages")
        .inner_text()
        .startswith("Token “gemini runner” revoked")
    )
    screenshot(page, "api-tokens-revoked")
    assert ApiToken.objects.get(user=page.user).revoked_at is not None
