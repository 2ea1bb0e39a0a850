"""The official Python SDK signs in to the live site the way the MCP
authorization spec describes: a 401 names the metadata, the client registers
itself, its person allows it on the consent page, and it calls tools with a
short-lived token that it refreshes; once the person signs it out, it is
refused.

The person is a browser session of the live server (a logged-in cookie, and
HTTP requests to the authorization URL and the consent form), so the whole
sign-in runs over the same HTTP as any client's.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import parse_qs, urljoin, urlsplit

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from api.models import OAuthGrant
from tasks.models import Conversation
from tasks.plan import task_create
from tests.pippa_mcp.conftest import PLAN, data
from tests.pippa_mcp.test_http import INIT, _post
from tests.support.asyncrun import run_async
from tests.support.oauth import REDIRECT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FIELD = 'name="{name}" value="([^"]+)"'


class Memory:
    """The SDK's ``TokenStorage``: what a client keeps between sessions."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info):
        self.client = client_info


class Person:
    """Dad at his browser, logged in to the live site: he opens the
    authorization URL the client shows him and answers the consent page."""

    def __init__(self, session_cookie: str, *, decision: str = "allow") -> None:
        self.cookies = {"sessionid": session_cookie}
        self.decision = decision
        self.pages: list[str] = []
        self.back = ""

    async def open(self, url: str) -> None:
        async with httpx2.AsyncClient(cookies=self.cookies, timeout=30) as browser:
            sent = await browser.get(url)
            assert sent.status_code == 302, sent.text
            consent = urljoin(url, sent.headers["location"])
            page = await browser.get(consent)
            assert page.status_code == 200, page.text
            self.pages.append(page.text)
            form = {
                name: re.search(FIELD.format(name=name), page.text).group(1)
                for name in ("csrfmiddlewaretoken", "request")
            }
            answer = await browser.post(
                consent.split("?")[0],
                data={**form, "decision": self.decision, "days": "30"},
            )
            assert answer.status_code == 302, answer.text
            self.back = answer.headers["location"]

    async def callback(self) -> AuthorizationCodeResult:
        assert self.back.startswith(REDIRECT)
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.back).query).items()}
        if "code" not in query:
            raise PermissionError(f"the person answered {query.get('error')}")
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )


def _provider(mcp_url: str, person: Person, storage: Memory) -> OAuthClientProvider:
    return OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="Python SDK agent",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=person.open,
        callback_handler=person.callback,
    )


async def _calls(mcp_url: str, provider: OAuthClientProvider, calls):
    """Call each (tool, args) in one session; ``("resources/list", None)`` lists resources."""
    with anyio.fail_after(90):
        async with (
            create_mcp_http_client(auth=provider) as http,
            streamable_http_client(mcp_url, http_client=http) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            return [
                await session.list_resources()
                if name == "resources/list"
                else await session.call_tool(name, args)
                for name, args in calls
            ]


@pytest.fixture
def dad_session(client, user) -> str:
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_a_401_names_the_metadata_and_the_metadata_names_this_server(
    mcp_url, asgi_server
):
    status, headers, _ = _post(mcp_url, INIT)
    challenge = headers["www-authenticate"]
    base = asgi_server.url
    assert status == 401
    assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp/"' in (
        challenge
    )
    status, headers, _ = _post(mcp_url, INIT, Authorization="Bearer pipa_stale")
    assert status == 401
    assert 'error="invalid_token"' in headers["www-authenticate"]
    with httpx2.Client(timeout=30) as http:
        resource = http.get(f"{base}/.well-known/oauth-protected-resource/mcp/").json()
        server = http.get(f"{base}/.well-known/oauth-authorization-server").json()
    assert resource["resource"] == mcp_url
    assert resource["authorization_servers"] == [base]
    assert server["issuer"] == base
    assert server["token_endpoint"] == f"{base}/oauth/token/"


def test_the_python_sdk_signs_in_lists_tasks_and_is_refused_once_signed_out(
    mcp_url, user, client, dad_session
):
    conversation = Conversation.objects.create(owner=user, title="PIPA")
    task = task_create(conversation=conversation, title="Brief", steps=PLAN)
    person = Person(dad_session)
    storage = Memory()

    listed, resources = run_async(
        _calls,
        mcp_url,
        _provider(mcp_url, person, storage),
        [
            ("list_tasks", {"conversation_id": conversation.pk}),
            ("resources/list", None),
        ],
    )

    assert [t["id"] for t in data(listed)["tasks"]] == [task.pk]
    # The first page is the user's tasks; conversations and artifacts follow.
    assert [r.uri for r in resources.resources] == [f"pippa://task/{task.pk}"]
    assert resources.next_cursor
    assert len(person.pages) == 1
    assert "Python SDK agent wants to read and run your tasks" in person.pages[0]
    grant = OAuthGrant.objects.get()
    assert (grant.user, grant.client_name, grant.resource) == (
        user,
        "Python SDK agent",
        mcp_url,
    )
    assert storage.tokens.access_token.startswith("pipa_")

    # Dad signs it out on the tokens page.
    client.post(f"/settings/tokens/sign-ins/{grant.pk}/revoke/")
    status, headers, body = _post(
        mcp_url, INIT, Authorization=f"Bearer {storage.tokens.access_token}"
    )
    assert status == 401
    assert 'error="invalid_token"' in headers["www-authenticate"]
    assert "sign in" in json.loads(body)["error"]["message"]
    # The client meets the 401 and asks its person again, who says no.
    person.decision = "deny"
    with pytest.raises(ExceptionGroup) as refused:
        run_async(
            _calls,
            mcp_url,
            _provider(mcp_url, person, storage),
            [("list_tasks", {"conversation_id": conversation.pk})],
        )
    assert refused.group_contains(PermissionError, match="access_denied")
    assert len(person.pages) == 2
    assert OAuthGrant.objects.filter(revoked_at__isnull=True).count() == 0


def test_an_expired_access_token_is_refused_and_the_sdk_refreshes_it(
    mcp_url, user, dad_session, settings
):
    settings.PIPPA_OAUTH_ACCESS_SECONDS = 2
    conversation = Conversation.objects.create(owner=user, title="PIPA")
    person = Person(dad_session)
    storage = Memory()
    provider = _provider(mcp_url, person, storage)
    call = [("list_conversations", {})]

    run_async(_calls, mcp_url, provider, call)
    first = storage.tokens
    assert first.expires_in <= 2
    time.sleep(2.5)
    status, _, _ = _post(mcp_url, INIT, Authorization=f"Bearer {first.access_token}")
    assert status == 401
    (listed,) = run_async(_calls, mcp_url, provider, call)

    assert [c["id"] for c in data(listed)["conversations"]] == [conversation.pk]
    assert storage.tokens.access_token != first.access_token
    assert storage.tokens.refresh_token != first.refresh_token
    assert len(person.pages) == 1  # refreshed, not asked again
    assert OAuthGrant.objects.count() == 1
