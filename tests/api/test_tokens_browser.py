"""The token page in a real browser: create (shown once), copy, then revoke (confirmed)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from api.models import ApiToken

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
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.locator("#copy-status")).to_contain_text("Copied.")
    assert page.evaluate("navigator.clipboard.readText()") == raw
    screenshot(page, "api-tokens-created")
    page.reload()  # a reload makes no second token and shows the secret no more
    expect(page.locator("#new-token")).to_have_count(0)
    assert raw not in page.content()
    assert ApiToken.objects.filter(user=page.user).count() == 1
    page.get_by_role("link", name="Revoke… gemini runner").click()
    expect(
        page.get_by_role("heading", name="Revoke the token “gemini runner”?")
    ).to_be_visible()
    assert ApiToken.objects.get(user=page.user).revoked_at is None
    page.get_by_role("button", name="Revoke “gemini runner”").click()
    assert (
        page.locator(".messages")
        .inner_text()
        .startswith("Token “gemini runner” revoked")
    )
    screenshot(page, "api-tokens-revoked")
    assert ApiToken.objects.get(user=page.user).revoked_at is not None
