"""The notification pages as Dad meets them: found from the header, a form
that does what he means, and "Turn these off" from a message without a login."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from notifications.models import Notice, NotifySettings
from notifications.outbox import (
    notify_deliver,
    notify_settings_save,
    notify_unsubscribe_token,
    notify_unsubscribe_url,
)
from notifications.views import MSG_SAVED_BUT_OFF, MSG_SAVED_ON
from tasks.models import Step
from tasks.plan import task_create
from tests.support.executing import crash_at, expire_lease, run_task


@pytest.fixture
def mail_server(settings):
    settings.PIPPA_NOTIFY_URLS = ["mailto://127.0.0.1:9?from=pippa@example.org"]
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    settings.PIPPA_SITE_URL = "http://testserver"


@pytest.mark.django_db
def test_every_page_header_leads_to_notifications(dad_client):
    home = dad_client.get(reverse("dashboard:conversations")).content.decode()
    page = dad_client.get(reverse("notify_settings")).content.decode()

    header = home.split("</header>")[0]
    assert f'href="{reverse("notify_settings")}">Notifications</a>' in header
    assert 'aria-current="page">Notifications</a>' in page.split("</header>")[0]


@pytest.mark.django_db
def test_a_first_visit_comes_ticked_so_an_address_saved_turns_messages_on(
    make_user, client, mail_server
):
    client.force_login(make_user(username="dad"))
    first = client.get(reverse("notify_settings")).content.decode()
    assert 'name="enabled" checked' in first

    saved = client.post(
        reverse("notify_settings"),
        {"enabled": "on", "addresses": "dad@example.org"},
        follow=True,
    )
    assert MSG_SAVED_ON in saved.content.decode()
    assert NotifySettings.objects.get().enabled


@pytest.mark.django_db
def test_saving_an_address_with_the_box_unticked_says_messages_are_off(
    make_user, client, mail_server
):
    client.force_login(make_user(username="dad"))
    saved = client.post(
        reverse("notify_settings"), {"addresses": "dad@example.org"}, follow=True
    )
    assert MSG_SAVED_BUT_OFF in saved.content.decode()
    assert not NotifySettings.objects.get().enabled
    # Once saved, the page shows what was saved: unticked.
    again = client.get(reverse("notify_settings")).content.decode()
    assert 'name="enabled" checked' not in again


@pytest.mark.django_db
def test_the_address_box_has_an_example_and_a_test_button(dad_client, mail_server):
    page = dad_client.get(reverse("notify_settings")).content.decode()
    assert 'placeholder="you@example.org"' in page
    assert f'formaction="{reverse("notify_settings_test")}"' in page
    assert "Send a test message" in page


def _set_aside(make_conversation, owner):
    task = task_create(
        conversation=make_conversation(owner=owner),
        title="Send the invoice",
        steps=[{"title": "E-mail the invoice", "tool": "test.effect", "args": {}}],
    )
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    run_task(task.pk, worker_id="worker:next")
    return task


@pytest.mark.django_db
def test_one_click_unsubscribe_turns_off_only_the_owners_messages_without_a_login(
    make_user, make_conversation, mail_server
):
    dad, mum = make_user(username="dad"), make_user(username="mum")
    notify_settings_save(user=dad, enabled=True, addresses="dad@example.org")
    notify_settings_save(user=mum, enabled=True, addresses="mum@example.org")
    _set_aside(make_conversation, dad)
    url = notify_unsubscribe_url(dad.pk).removeprefix("http://testserver")
    # A mail client's RFC 8058 POST: no cookie, no CSRF token.
    mail_client = Client(enforce_csrf_checks=True)

    looked = mail_client.get(url)  # a link scanner's GET changes nothing
    assert looked.status_code == 200
    assert NotifySettings.objects.get(user=dad).enabled

    done = mail_client.post(
        url,
        "List-Unsubscribe=One-Click",
        content_type="application/x-www-form-urlencoded",
    )

    assert done.status_code == 200
    assert "Messages are off" in done.content.decode()
    assert not NotifySettings.objects.get(user=dad).enabled
    assert NotifySettings.objects.get(user=mum).enabled
    assert NotifySettings.objects.get(user=dad).addresses == "dad@example.org"
    # What waited to be sent is dropped, not sent.
    notify_deliver(worker_id="worker:mail")
    assert Notice.objects.get().state == Notice.State.DROPPED


@pytest.mark.django_db
@pytest.mark.parametrize(
    "token",
    ["nonsense", "eyJ1IjoxfQ:1xaO6D:forged-signature-forged-signature", ""],
)
def test_a_token_this_site_did_not_sign_turns_nothing_off(
    token, make_user, mail_server
):
    dad = make_user(username="dad")
    notify_settings_save(user=dad, enabled=True, addresses="dad@example.org")
    response = Client().post(f"/settings/notifications/off/{token}/")
    assert response.status_code == 404
    assert NotifySettings.objects.get(user=dad).enabled


@pytest.mark.django_db
def test_an_unsubscribe_token_names_its_owner_and_nobody_else(make_user):
    dad, mum = make_user(username="dad"), make_user(username="mum")
    assert notify_unsubscribe_token(dad.pk) != notify_unsubscribe_token(mum.pk)
    tampered = notify_unsubscribe_token(dad.pk).replace(
        notify_unsubscribe_token(dad.pk).split(":")[0],
        notify_unsubscribe_token(mum.pk).split(":")[0],
    )
    assert Client().post(f"/settings/notifications/off/{tampered}/").status_code == 404


@pytest.mark.django_db
def test_a_decision_link_for_a_step_already_decided_opens_its_row_and_says_so(
    make_user, make_conversation, client
):
    dad = make_user(username="dad")
    task = _set_aside(make_conversation, dad)
    step = Step.objects.get(task=task)
    Step.objects.filter(pk=step.pk).update(status=Step.Status.SKIPPED)
    client.force_login(dad)

    opened = client.get(reverse("dashboard:task_decide", args=[task.pk, 1]))

    assert opened["Location"] == f"/tasks/{task.pk}/#step-1"
    page = client.get(opened["Location"]).content.decode()
    assert "Step 1 no longer waits for you: it is skipped now." in page
    assert (
        client.get(reverse("dashboard:task_decide", args=[task.pk, 9])).status_code
        == 404
    )
