"""Addresses are checked again when a message goes out, on the address each
connection really reaches.

The receivers listen on loopback (``tests.support.receivers``), the only
address these tests connect to; a name's other answers come from the tests'
``StubResolver``. Starting a server makes them ``slow``.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from notifications.models import Notice
from notifications.outbox import notify_deliver, notify_settings_save
from tasks.models import Step
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease, run_task
from tests.support.receivers import HttpSink


@pytest.fixture
def hook(settings):
    """A webhook receiver on this machine, reached as a json:// address (the
    operator allows that scheme here; loopback stays refused)."""
    sink = HttpSink().start()
    settings.PIPPA_NOTIFY_ALLOW_SCHEMES = ["json"]
    settings.PIPPA_NOTIFY_ALLOW_NETWORKS = []
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    settings.PIPPA_SITE_URL = "http://testserver"
    yield sink
    sink.stop()


def set_aside(make_conversation, owner):
    task = task_create(
        conversation=make_conversation(owner=owner),
        title="Send the invoice",
        steps=[{"title": "E-mail the invoice", "tool": "test.effect", "args": {}}],
    )
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    run_task(task.pk, worker_id="worker:next")
    assert Step.objects.get(task=task).status == Step.Status.NEEDS_REVIEW
    return task


@pytest.mark.slow
@pytest.mark.django_db
def test_a_name_that_resolves_to_loopback_at_send_time_is_refused(
    make_user, make_conversation, hook, resolver
):
    # Public when saved ...
    resolver.names["hook.example.net"] = ["93.184.215.14"]
    dad = make_user(username="dad")
    notify_settings_save(
        user=dad, enabled=True, addresses=f"json://hook.example.net:{hook.port}/hook"
    )
    set_aside(make_conversation, dad)
    # ... this machine when the message goes out.
    resolver.names["hook.example.net"] = ["127.0.0.1"]

    report = notify_deliver(worker_id="worker:hook")

    assert (report.messages, report.failed) == (0, 1)
    assert hook.requests == []
    notice = Notice.objects.get()
    assert notice.state == Notice.State.PENDING  # tried again later, checked again
    assert "this machine (loopback) (127.0.0.1)" in notice.note


@pytest.mark.slow
@pytest.mark.django_db
def test_a_connection_to_loopback_is_refused_whatever_the_name_said_a_moment_before(
    make_user, make_conversation, hook, resolver
):
    # The check before sending is told a public address (a name that changes
    # its answer between two lookups); the plugin's own lookup reaches this
    # machine, and the connection itself is refused.
    resolver.names["localhost"] = ["93.184.215.14"]
    dad = make_user(username="dad")
    notify_settings_save(
        user=dad, enabled=True, addresses=f"json://localhost:{hook.port}/hook"
    )
    set_aside(make_conversation, dad)

    report = notify_deliver(worker_id="worker:hook")

    assert (report.messages, report.failed) == (0, 1)
    assert hook.requests == []
    assert "refused to connect to this machine (loopback)" in Notice.objects.get().note


@pytest.mark.slow
@pytest.mark.django_db
def test_an_allowed_loopback_receiver_gets_the_message_without_the_urls_own_headers(
    make_user, make_conversation, hook, settings
):
    settings.PIPPA_NOTIFY_ALLOW_NETWORKS = ["127.0.0.1/32"]
    dad = make_user(username="dad")
    notify_settings_save(
        user=dad, enabled=True, addresses=f"json://127.0.0.1:{hook.port}/hook"
    )
    task = set_aside(make_conversation, dad)

    assert notify_deliver(worker_id="worker:hook").messages == 1
    [request] = hook.requests
    assert request["path"] == "/hook"
    assert f"/tasks/{task.pk}/decide/1/" in request["json"]["message"]
    assert "\n" in request["json"]["message"]  # a text with line breaks


@pytest.mark.slow
@pytest.mark.django_db
def test_the_test_button_sends_one_message_and_then_waits(
    make_user, client, hook, settings
):
    settings.PIPPA_NOTIFY_ALLOW_NETWORKS = ["127.0.0.1/32"]
    settings.PIPPA_NOTIFY_TEST_SECONDS = 30
    client.force_login(make_user(username="dad"))
    address = f"json://127.0.0.1:{hook.port}/hook"
    url = reverse("notify_settings_test")

    sent = client.post(url, {"enabled": "on", "addresses": address})
    again = client.post(url, {"enabled": "on", "addresses": address})

    assert sent.status_code == 200
    text = sent.content.decode()
    assert "A test message went to" in text
    assert "not saved yet" in text
    assert address in text  # the form keeps what he typed
    assert len(hook.requests) == 1
    assert "test message" in hook.requests[0]["json"]["message"]
    assert again.status_code == 400
    assert "wait" in again.content.decode()
    assert len(hook.requests) == 1


@pytest.mark.slow
@pytest.mark.django_db
def test_the_test_button_says_when_the_address_was_refused_at_send_time(
    make_user, client, hook, resolver
):
    resolver.names["localhost"] = ["93.184.215.14"]  # the check is fooled
    client.force_login(make_user(username="dad"))

    page = client.post(
        reverse("notify_settings_test"),
        {"enabled": "on", "addresses": f"json://localhost:{hook.port}/hook"},
    )

    assert "did not go out" in page.content.decode()
    assert "refused to connect to this machine" in page.content.decode()
    assert hook.requests == []
