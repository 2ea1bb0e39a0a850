"""A client that has not signed in may send a small body only.

``pippa_site.asgi.BodyLimit`` refuses (413) a body larger than
``PIPPA_MAX_ANONYMOUS_BODY_BYTES`` from a client with no signed-in session and
no token that passes, before reading it (declared) or as soon as it passes the
bound (sent in chunks). A signed-in session or a token sends up to a form's
size as before. The router is called as the server calls it, with a stub in
Django's place that says what reached it.
"""

from __future__ import annotations

import json

import anyio
import pytest
from django.conf import settings
from django.test import Client

from api.services import token_create
from pippa_site.asgi import ERR_BODY_SIGN_IN, BodyLimit

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 64 * 1024


@pytest.fixture(autouse=True)
def cap(settings):
    settings.PIPPA_MAX_ANONYMOUS_BODY_BYTES = CAP


class Stub:
    """Django's place: reads the whole body, answers 200 with its length."""

    def __init__(self):
        self.called = False
        self.body = b""

    async def __call__(self, scope, receive, send):
        self.called = True
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _call(headers: dict[str, str], chunks: list[bytes], *, declare: bool = True):
    """Run BodyLimit(stub) over one POST /login/; return (stub, status, body,
    how many chunks the client was asked for)."""
    stub = Stub()
    total = sum(len(c) for c in chunks)
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    if declare:
        raw.append((b"content-length", str(total).encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/login/",
        "headers": raw,
        "client": ("127.0.0.1", 50000),
    }
    asked = 0
    sent: list[dict] = []

    async def receive():
        nonlocal asked
        if asked >= len(chunks):
            return {"type": "http.disconnect"}
        asked += 1
        return {
            "type": "http.request",
            "body": chunks[asked - 1],
            "more_body": asked < len(chunks),
        }

    async def send(message):
        sent.append(message)

    anyio.run(BodyLimit(stub), scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body"
    )
    return stub, start["status"], body, asked


def _signed_in_cookie(user) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    return {"Cookie": f"{settings.SESSION_COOKIE_NAME}={key}"}


BIG = [b"a" * (32 * 1024)] * 4  # 128 KiB: past the cap, within a form's size


def test_a_large_declared_body_from_a_client_not_signed_in_is_refused_unread():
    stub, status, body, asked = _call({}, BIG)
    assert status == 413
    assert json.loads(body) == {"detail": ERR_BODY_SIGN_IN}
    assert not stub.called
    assert asked == 0  # not a byte of it was read


def test_a_large_body_sent_in_chunks_is_refused_once_it_passes_the_cap():
    stub, status, body, asked = _call({}, BIG, declare=False)
    assert status == 413
    assert json.loads(body) == {"detail": ERR_BODY_SIGN_IN}
    assert asked == 3  # 96 KiB read: the chunk that passed 64 KiB, no more
    assert stub.body == b"a" * (64 * 1024)  # what reached Django before it stopped


def test_a_small_body_from_a_client_not_signed_in_passes():
    stub, status, _, _ = _call({}, [b"username=dad&password=x"])
    assert status == 200
    assert stub.body == b"username=dad&password=x"


def test_a_signed_in_session_sends_a_large_body(make_user):
    stub, status, _, _ = _call(_signed_in_cookie(make_user()), BIG)
    assert status == 200
    assert len(stub.body) == 128 * 1024


def test_a_signed_in_session_sends_a_large_body_in_chunks(make_user):
    stub, status, _, _ = _call(_signed_in_cookie(make_user()), BIG, declare=False)
    assert status == 200
    assert len(stub.body) == 128 * 1024


def test_a_token_that_passes_sends_a_large_body(make_user):
    raw = token_create(user=make_user(), name="agent").raw
    stub, status, _, _ = _call({"Authorization": f"Bearer {raw}"}, BIG)
    assert status == 200
    assert len(stub.body) == 128 * 1024


@pytest.mark.parametrize(
    "headers",
    [
        {"Cookie": f"{settings.SESSION_COOKIE_NAME}=no-such-session-key-0123456789"},
        {"Authorization": "Bearer not-a-token"},
    ],
    ids=["a made-up session cookie", "a token that does not pass"],
)
def test_a_made_up_cookie_or_token_does_not_count_as_signed_in(headers):
    stub, status, body, asked = _call(headers, BIG)
    assert status == 413
    assert json.loads(body) == {"detail": ERR_BODY_SIGN_IN}
    assert not stub.called
    assert asked == 0


def test_a_session_without_a_user_does_not_count_as_signed_in():
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store["note"] = "an anonymous visitor's session"
    store.save()
    cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={store.session_key}"}
    stub, status, _, asked = _call(cookie, BIG)
    assert status == 413
    assert not stub.called
    assert asked == 0
