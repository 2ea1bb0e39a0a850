"""Signing an MCP client in with a real browser: the official Python SDK's
OAuth client against the live site, and Chromium as the person.

The client opens the authorization URL; Dad is not logged in, so the site
asks him to log in first and then shows the consent page (the sign-in waited
at ``?next=``); he allows it, and the browser is sent back to the client's
loopback address (which the test answers, as the client's own listener
would). Chromium applies the consent page's ``form-action`` to that redirect,
so this is where a policy that forgot the client's origin would show.
"""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.to_thread
import pytest
from mcp.shared.auth import AuthorizationCodeResult
from playwright.sync_api import expect

from api.models import OAuthGrant
from tasks.models import Conversation
from tasks.plan import task_create
from tests.pippa_mcp.conftest import PLAN, data
from tests.pippa_mcp.test_oauth_http import Memory, _calls, _provider
from tests.support.oauth import REDIRECT, consent_path

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 60


class BrowserPerson:
    """Hands the authorization URL to the test thread's browser and waits for
    where the browser was sent back (Playwright's page lives in that thread)."""

    def __init__(self) -> None:
        self.urls: queue.Queue[str] = queue.Queue()
        self.answers: queue.Queue[str] = queue.Queue()

    async def open(self, url: str) -> None:
        self.urls.put(url)

    async def callback(self) -> AuthorizationCodeResult:
        back = await anyio.to_thread.run_sync(self.answers.get, True, WAIT)
        query = {k: v[0] for k, v in parse_qs(urlsplit(back).query).items()}
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )


def test_dad_logs_in_allows_claude_on_the_consent_page_and_the_sdk_lists_tasks(
    page, asgi_server, mcp_url, make_user, screenshot
):
    dad = make_user(username="dad-consent")
    conversation = Conversation.objects.create(owner=dad, title="PIPA")
    task = task_create(conversation=conversation, title="Brief", steps=PLAN)
    person = BrowserPerson()
    storage = Memory()
    calls = [("list_tasks", {"conversation_id": conversation.pk})]
    back: list[str] = []

    def client_listener(route):
        back.append(route.request.url)
        route.fulfill(status=200, body="Signed in: you may close this tab.")

    page.route(f"{REDIRECT}**", client_listener)
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(
            anyio.run, _calls, mcp_url, _provider(mcp_url, person, storage), calls
        )
        page.goto(person.urls.get(timeout=WAIT))

        # Not logged in: the login form first, and the sign-in waits.
        expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        page.fill("#id_username", dad.username)
        page.fill("#id_password", "correct horse battery staple")
        page.click("button[type=submit]")
        heading = "Python SDK agent wants to read and run your tasks"
        expect(page.get_by_role("heading", name=heading)).to_be_visible()
        expect(page.get_by_label("Let it stay signed in for")).to_have_value("30")
        expect(page.locator(".confirm-card")).to_contain_text("http://127.0.0.1:33418")
        screenshot(page, "oauth-consent")
        page.get_by_label("Let it stay signed in for").select_option("7")
        page.get_by_role("button", name="Allow").click()
        expect(page.locator("body")).to_contain_text("Signed in")
        person.answers.put(back[-1])
        (listed,) = running.result(timeout=WAIT)

    assert [t["id"] for t in data(listed)["tasks"]] == [task.pk]
    grant = OAuthGrant.objects.get()
    assert grant.user == dad
    assert 6 <= (grant.expires_at - grant.created_at).days <= 7
    assert parse_qs(urlsplit(back[-1]).query)["iss"] == [asgi_server.url]

    # The tokens page lists it; Dad signs it out there.
    page.goto(f"{asgi_server.url}/settings/tokens/")
    expect(page.locator("#grants-h")).to_be_visible()
    page.get_by_role("link", name="Sign out… Python SDK agent").click()
    page.get_by_role("button", name="Sign out “Python SDK agent”").click()
    expect(page.locator(".messages")).to_contain_text("Python SDK agent is signed out")
    screenshot(page, "oauth-signed-out")
    assert OAuthGrant.objects.get().revoked_at is not None


def test_the_consent_page_wears_the_dashboards_look_and_deny_sends_access_denied(
    logged_in_page, screenshot
):
    """On the site's own server (static files served): the page a person
    meets, and the other answer."""
    page = logged_in_page
    _, path = consent_path(state="st", base=page.base_url)
    back: list[str] = []
    page.route(
        f"{REDIRECT}**",
        lambda route: (back.append(route.request.url), route.fulfill(body="back"))[1],
    )
    page.goto(page.base_url + path)

    heading = page.get_by_role(
        "heading", name="Claude Code wants to read and run your tasks"
    )
    expect(heading).to_be_visible()
    # The dashboard's stylesheet is applied (a card, the primary button).
    assert (
        page.locator(".confirm-card").evaluate("e => getComputedStyle(e).borderRadius")
        == "8px"
    )
    screenshot(page, "oauth-consent-look")
    page.get_by_role("button", name="Deny").click()
    expect(page.locator("body")).to_contain_text("back")
    query = parse_qs(urlsplit(back[-1]).query)
    assert query["error"] == ["access_denied"]
    assert query["state"] == ["st"]
    assert not OAuthGrant.objects.exists()
