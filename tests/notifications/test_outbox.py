"""Notifications: a step that starts waiting for a person tells its owner, once.

Tests that send use real receivers (``tests.support.receivers``): an aiosmtpd
SMTP server and an HTTP server behind Apprise's ``json://``; they start a
server, so they are ``slow``. Kills are simulated in process (``crash_at``, a
crash point that raises); ``test_outbox_crash`` kills real worker processes.
"""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from notifications.models import Notice, NotifySettings
from notifications.outbox import (
    DROPPED_DECIDED,
    DROPPED_OFF,
    ERR_BAD_EMAIL,
    ERR_NO_ADDRESS,
    ERR_NO_MAIL_SERVER,
    ERR_SITE_URL_BAD,
    ERR_SITE_URL_UNUSED,
    HEADER_MESSAGE_ID,
    message_id_header,
    notify_deliver,
    notify_settings_save,
    notify_site_problems,
    notify_step_waiting,
)
from tasks import crashpoints
from tasks.actions import step_resolve
from tasks.crashpoints import SimulatedCrash
from tasks.doctor import doctor_run
from tasks.models import Event, Step, Task
from tasks.plan import task_create
from tasks.services import conversation_delete
from tests.support.executing import crash_at, expire_lease, run_task
from tests.support.leftovers import assert_no_leftovers, subtree_snapshot
from tests.support.receivers import HttpSink, SmtpSink

LINK = re.compile(r"https?://\S+")
DECIDE = re.compile(r"https?://\S+/decide/\d+/")


@pytest.fixture
def mail_server(settings):
    """A mail server in the settings, with nothing listening: a send would fail."""
    settings.PIPPA_NOTIFY_URLS = [
        "mailto://127.0.0.1:9?from=pippa@example.org&mode=insecure"
    ]
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    settings.PIPPA_SITE_URL = "http://testserver"


@pytest.fixture
def smtp(settings, mail_server):
    sink = SmtpSink().start()
    settings.PIPPA_NOTIFY_URLS = [sink.url]
    yield sink
    sink.stop()


@pytest.fixture
def http_sink(settings):
    """A webhook receiver on this machine: a person's json:// address, which
    the operator's settings allow here (that scheme, loopback only)."""
    sink = HttpSink().start()
    settings.PIPPA_NOTIFY_ALLOW_SCHEMES = ["json"]
    settings.PIPPA_NOTIFY_ALLOW_NETWORKS = ["127.0.0.1/32"]
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    settings.PIPPA_SITE_URL = "http://testserver"
    yield sink
    sink.stop()


def person(make_user, name: str, *addresses: str):
    user = make_user(username=name)
    if addresses:
        notify_settings_save(user=user, enabled=True, addresses="\n".join(addresses))
    return user


def effect_set_aside(make_conversation, owner, title: str = "Send the invoice") -> Task:
    """An outside-effect step whose worker was killed mid-call; the next worker
    found its envelope open and set it aside for a person."""
    task = task_create(
        conversation=make_conversation(owner=owner),
        title=title,
        steps=[{"title": "E-mail the invoice", "tool": "test.effect", "args": {}}],
    )
    crash_at(task.pk, "after_started")
    expire_lease(task.pk)
    run_task(task.pk, worker_id="worker:next")
    assert Step.objects.get(task=task).status == Step.Status.NEEDS_REVIEW
    return task


@pytest.mark.slow
@pytest.mark.django_db
def test_a_step_set_aside_after_a_kill_emails_its_owner_once_with_a_working_link(
    make_user, make_conversation, smtp, client
):
    dad = person(make_user, "dad", "dad@example.org")
    mum = person(make_user, "mum", "mum@example.org")
    task = effect_set_aside(make_conversation, dad)
    # Mum's own task runs to the end: nothing waits for her.
    run_task(
        task_create(
            conversation=make_conversation(owner=mum),
            title="Mum's fetch",
            steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
        ).pk
    )

    report = notify_deliver(worker_id="worker:mail")
    again = notify_deliver(worker_id="worker:mail")

    assert (report.messages, report.notices, again.messages) == (1, 1, 0)
    assert smtp.to("mum@example.org") == []
    [mail] = smtp.to("dad@example.org")
    assert len(smtp.mails) == 1
    assert "Send the invoice" in mail.message["Subject"]
    notice = Notice.objects.get()
    assert (notice.owner, notice.state) == (dad, Notice.State.SENT)
    assert mail.headers("Message-ID") == [message_id_header(notice.message_id)]
    decide = f"http://testserver/tasks/{task.pk}/decide/1/"
    # A text part with line breaks, the reason in his words, the link whole.
    text = mail.part("plain")
    assert f"   Decide: {decide}" in text.splitlines()
    assert "Pippa cannot tell whether it went out" in text
    assert not re.search(r"\w+Error\b", text)
    # An HTML part: one paragraph a decision, a button-like link to its card.
    [paragraph] = re.findall(r'<p class="decision".*?</p>', mail.part("html"), re.S)
    assert f'<a href="{decide}"' in paragraph
    assert "Decide step 1" in paragraph
    # The link opens the card after a login on the way.
    assert LINK.findall(text)[0] == decide
    path = decide.removeprefix("http://testserver")
    to_login = client.get(path)
    assert to_login.status_code == 302
    assert to_login["Location"] == f"/login/?next={quote(path, safe='/')}"
    client.force_login(dad)
    opened = client.get(path)
    assert opened["Location"] == f"/tasks/{task.pk}/#attention-1"
    page = client.get(f"/tasks/{task.pk}/")
    assert b'id="attention-1"' in page.content
    client.force_login(mum)
    assert client.get(path).status_code == 404
    assert client.get(f"/tasks/{task.pk}/").status_code == 404


@pytest.mark.django_db
def test_no_message_goes_out_for_a_decision_already_taken(
    make_user, make_conversation, mail_server, settings
):
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 60  # still gathering when he decides
    dad = person(make_user, "dad", "dad@example.org")
    task = effect_set_aside(make_conversation, dad)
    assert Notice.objects.filter(state=Notice.State.PENDING).count() == 1

    step_resolve(step=Step.objects.get(task=task), action="skip", actor="dad")
    Notice.objects.update(due_at=timezone.now())
    report = notify_deliver(worker_id="worker:mail")

    assert (report.messages, report.failed, report.dropped) == (0, 0, 1)
    notice = Notice.objects.get()
    assert (notice.state, notice.note) == (Notice.State.DROPPED, DROPPED_DECIDED)


@pytest.mark.django_db
def test_an_owner_with_notifications_off_gets_no_notice_and_no_message(
    make_user, make_conversation, mail_server
):
    dad = person(make_user, "dad")  # never turned them on
    effect_set_aside(make_conversation, dad)
    assert not Notice.objects.exists()
    report = notify_deliver(worker_id="worker:mail")
    assert (report.messages, report.failed) == (0, 0)


@pytest.mark.django_db
def test_turning_notifications_off_drops_what_was_waiting_to_be_sent(
    make_user, make_conversation, mail_server
):
    dad = person(make_user, "dad", "dad@example.org")
    effect_set_aside(make_conversation, dad)
    notify_settings_save(user=dad, enabled=False, addresses="dad@example.org")

    report = notify_deliver(worker_id="worker:mail")
    assert (report.messages, report.failed, report.dropped) == (0, 0, 1)
    assert Notice.objects.get().note == DROPPED_OFF


@pytest.mark.slow
@pytest.mark.django_db
def test_a_step_out_of_attempts_tells_its_owner_too(
    make_user, make_conversation, smtp, settings
):
    settings.PIPPA_RETRY_BASE_SECONDS = 0
    dad = person(make_user, "dad", "dad@example.org")
    task = task_create(
        conversation=make_conversation(owner=dad),
        title="Flaky fetch",
        steps=[{"title": "fetch", "tool": "test.flaky", "args": {"fail_times": 9}}],
    )
    run_task(task.pk)
    assert Step.objects.get(task=task).status == Step.Status.FAILED

    assert notify_deliver(worker_id="worker:mail").messages == 1
    [mail] = smtp.to("dad@example.org")
    text = mail.part("plain")
    # What went wrong, in his words: the error's sentence, not its class.
    assert "“Flaky fetch”, step 1 “fetch” failed after 3 attempts." in text
    assert "   flaky failure on attempt 3" in text.splitlines()
    assert "ConnectionError" not in text
    assert "ConnectionError" not in mail.part("html")


@pytest.mark.slow
@pytest.mark.django_db
def test_several_decisions_within_the_window_become_one_message(
    make_user, make_conversation, smtp, settings
):
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 60
    settings.PIPPA_NOTIFY_WINDOW_SECONDS = 300
    dad = person(make_user, "dad", "dad@example.org")
    tasks = [
        effect_set_aside(make_conversation, dad, f"Invoice {n}") for n in (1, 2, 3)
    ]
    # Nothing before the gathering delay is over.
    assert notify_deliver(worker_id="worker:mail").messages == 0
    Notice.objects.update(due_at=timezone.now())

    report = notify_deliver(worker_id="worker:mail")

    assert (report.messages, report.notices) == (1, 3)
    [mail] = smtp.mails
    assert "3 decisions wait for you" in mail.message["Subject"]
    assert len(DECIDE.findall(mail.body)) == 3
    for task in tasks:
        assert f"/tasks/{task.pk}/decide/1/" in mail.body
    assert len(re.findall(r'<p class="decision"', mail.part("html"))) == 3

    # A fourth one inside the window waits for the window to close ...
    fourth = effect_set_aside(make_conversation, dad, "Invoice 4")
    Notice.objects.filter(state=Notice.State.PENDING).update(due_at=timezone.now())
    assert notify_deliver(worker_id="worker:mail").messages == 0
    waiting = Notice.objects.get(state=Notice.State.PENDING)
    assert waiting.due_at >= Notice.objects.filter(
        state=Notice.State.SENT
    ).first().sent_at + timedelta(seconds=299)
    # ... and then goes alone.
    Notice.objects.filter(state=Notice.State.SENT).update(
        sent_at=timezone.now() - timedelta(seconds=301)
    )
    Notice.objects.filter(state=Notice.State.PENDING).update(due_at=timezone.now())
    assert notify_deliver(worker_id="worker:mail").messages == 1
    assert len(smtp.mails) == 2
    assert f"/tasks/{fourth.pk}/decide/1/" in smtp.mails[1].body


@pytest.mark.slow
@pytest.mark.django_db
def test_a_receiver_that_fails_is_tried_again_after_a_back_off_with_the_same_id(
    make_user, make_conversation, http_sink, settings
):
    settings.PIPPA_NOTIFY_RETRY_BASE_SECONDS = 30
    settings.PIPPA_NOTIFY_RETRY_MAX_SECONDS = 3600
    dad = person(make_user, "dad", http_sink.url)
    effect_set_aside(make_conversation, dad)
    http_sink.fail = 2

    first = notify_deliver(worker_id="worker:hook")
    notice = Notice.objects.get()
    wait = (notice.due_at - timezone.now()).total_seconds()
    assert (first.messages, first.failed, len(http_sink.requests)) == (0, 1, 1)
    assert (notice.state, notice.attempts) == (Notice.State.PENDING, 1)
    assert 14 <= wait <= 30  # base, jittered to between half and all of it
    assert "refused" in notice.note
    # Not before the back-off is over.
    assert notify_deliver(worker_id="worker:hook").failed == 0
    assert len(http_sink.requests) == 1

    Notice.objects.update(due_at=timezone.now())
    assert notify_deliver(worker_id="worker:hook").failed == 1
    notice.refresh_from_db()
    assert notice.attempts == 2
    assert 29 <= (notice.due_at - timezone.now()).total_seconds() <= 60  # doubled

    Notice.objects.update(due_at=timezone.now())
    assert notify_deliver(worker_id="worker:hook").messages == 1
    ids = {r["headers"][HEADER_MESSAGE_ID] for r in http_sink.requests}
    assert ids == {message_id_header(notice.message_id)}
    assert len(http_sink.requests) == 3
    assert "/tasks/" in http_sink.requests[-1]["json"]["message"]
    assert Notice.objects.get().state == Notice.State.SENT


@pytest.mark.slow
@pytest.mark.django_db
def test_the_back_off_of_a_failing_receiver_is_capped(
    make_user, make_conversation, http_sink, settings
):
    settings.PIPPA_NOTIFY_RETRY_MAX_SECONDS = 600
    dad = person(make_user, "dad", http_sink.url)
    effect_set_aside(make_conversation, dad)
    Notice.objects.update(attempts=40)
    http_sink.fail = 1

    notify_deliver(worker_id="worker:hook")

    wait = (Notice.objects.get().due_at - timezone.now()).total_seconds()
    assert 299 <= wait <= 600


@pytest.mark.slow
@pytest.mark.django_db
def test_a_worker_killed_after_sending_leaves_the_message_to_be_sent_again_with_the_same_message_id(
    make_user, make_conversation, smtp
):
    dad = person(make_user, "dad", "dad@example.org")
    effect_set_aside(make_conversation, dad)
    crashpoints.arm("after_notify_sent", action="raise")
    try:
        with pytest.raises(SimulatedCrash):
            notify_deliver(worker_id="worker:killed")
    finally:
        crashpoints.disarm()
    notice = Notice.objects.get()
    assert (notice.state, notice.claimed_by) == (Notice.State.PENDING, "worker:killed")
    # The dead worker's claim holds until it runs out: no second worker sends.
    assert notify_deliver(worker_id="worker:other").messages == 0
    Notice.objects.update(claimed_until=timezone.now() - timedelta(seconds=1))

    assert notify_deliver(worker_id="worker:other").messages == 1

    first, repeat = smtp.to("dad@example.org")
    assert first.headers("Message-ID") == repeat.headers("Message-ID")
    assert first.headers("Message-ID") == [message_id_header(notice.message_id)]
    assert Notice.objects.get().state == Notice.State.SENT


@pytest.mark.django_db
def test_a_transition_written_twice_still_makes_one_notice(
    make_user, make_conversation, mail_server
):
    dad = person(make_user, "dad", "dad@example.org")
    task = task_create(
        conversation=make_conversation(owner=dad),
        title="t",
        steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
    )
    step = Step.objects.get(task=task)
    with transaction.atomic():
        assert notify_step_waiting(step_id=step.pk, reason="needs_review")
        # Written twice (a crash replays the transition): still one notice.
        assert notify_step_waiting(step_id=step.pk, reason="needs_review")
    assert Notice.objects.filter(step=step).count() == 1


@pytest.mark.slow
@pytest.mark.django_db
def test_a_hostile_title_stays_one_line_and_adds_no_recipient(
    make_user, make_conversation, smtp
):
    dad = person(make_user, "dad", "dad@example.org")
    effect_set_aside(make_conversation, dad, "Pay\r\nBcc: thief@example.net\r\n\r\nhi")

    assert notify_deliver(worker_id="worker:mail").messages == 1

    [mail] = smtp.mails
    assert mail.envelope_to == ["dad@example.org"]
    assert mail.headers("Bcc") == []
    assert "\n" not in mail.message["Subject"]
    assert "Bcc: thief@example.net" in mail.message["Subject"]


@pytest.mark.django_db
def test_a_call_the_doctor_hands_to_a_person_tells_its_owner(
    make_user, make_conversation, mail_server
):
    dad = person(make_user, "dad", "dad@example.org")
    task = task_create(
        conversation=make_conversation(owner=dad),
        title="Search",
        steps=[{"title": "search", "tool": "test.snapshot", "args": {}}],
    )
    step = Step.objects.get(task=task)
    # A call left open on a task no worker will step again (it failed).
    Step.objects.filter(pk=step.pk).update(status=Step.Status.RUNNING)
    Event.objects.create(
        task=task,
        step=step,
        seq=task.last_seq + 1,
        kind=Event.Kind.TOOL_CALL_STARTED,
        created_at=timezone.now() - timedelta(hours=2),
    )
    Task.objects.filter(pk=task.pk).update(
        status=Task.Status.FAILED, last_seq=task.last_seq + 1
    )

    doctor_run(repair=True, verify=False)

    assert Step.objects.get(pk=step.pk).status == Step.Status.NEEDS_REVIEW
    notice = Notice.objects.get()
    assert (notice.owner, notice.step, notice.reason) == (dad, step, "needs_review")


# -- the settings page ----------------------------------------------------------


@pytest.mark.django_db
def test_the_settings_page_saves_each_persons_own_choice(
    make_user, client, mail_server
):
    dad, mum = make_user(username="dad"), make_user(username="mum")
    url = reverse("notify_settings")
    client.force_login(dad)

    saved = client.post(url, {"enabled": "on", "addresses": "dad@example.org\n"})
    page = client.get(url)

    assert saved.status_code == 302
    assert b"dad@example.org" in page.content
    assert NotifySettings.objects.get(user=dad).enabled
    client.force_login(mum)
    theirs = client.get(url)
    assert b"dad@example.org" not in theirs.content
    assert not NotifySettings.objects.filter(user=mum).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("addresses", "error"),
    [
        ("not an address", ERR_BAD_EMAIL.format(address="not an address")),
        ("nosuchscheme://x/y", "Apprise does not know how to send"),
        ("", ERR_NO_ADDRESS),
        ("dad@example.org\x00", "cannot be stored"),
    ],
)
def test_the_settings_page_refuses_what_apprise_cannot_send_to(
    addresses, error, make_user, client, mail_server
):
    client.force_login(make_user(username="dad"))
    page = client.post(
        reverse("notify_settings"), {"enabled": "on", "addresses": addresses}
    )
    assert page.status_code == 400
    assert error.encode() in page.content.replace(b"&#x27;", b"'").replace(
        b"&quot;", b'"'
    )
    assert not NotifySettings.objects.exists()


@pytest.mark.django_db
def test_an_email_address_needs_the_sites_mail_server(make_user, client, settings):
    settings.PIPPA_NOTIFY_URLS = []
    client.force_login(make_user(username="dad"))
    page = client.post(
        reverse("notify_settings"), {"enabled": "on", "addresses": "dad@example.org"}
    )
    assert page.status_code == 400
    assert b"no mail server" in page.content
    assert ERR_NO_MAIL_SERVER.startswith("this site has no mail server")
    # An Apprise URL of his own needs no mail server.
    ok = client.post(
        reverse("notify_settings"),
        {"enabled": "on", "addresses": "ntfys://ntfy.sh/pippa-dad"},
    )
    assert ok.status_code == 302


@pytest.mark.django_db
def test_the_settings_page_is_for_logged_in_people_only(client):
    page = client.get(reverse("notify_settings"))
    assert page.status_code == 302
    assert "/login/" in page["Location"]


# -- deletion ---------------------------------------------------------------------


@pytest.mark.django_db
def test_deleting_a_conversation_takes_its_notices_and_deleting_a_person_their_settings(
    make_user, make_conversation, mail_server, django_capture_on_commit_callbacks
):
    dad = person(make_user, "dad", "dad@example.org")
    mum = person(make_user, "mum", "mum@example.org")
    task = effect_set_aside(make_conversation, dad)
    effect_set_aside(make_conversation, mum)
    before = subtree_snapshot(task.conversation_id)
    assert before.notices

    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation_id=task.conversation_id)

    assert_no_leftovers(before)
    assert list(Notice.objects.values_list("owner__username", flat=True)) == ["mum"]
    mum.delete()
    assert not Notice.objects.exists()
    assert list(NotifySettings.objects.values_list("user__username", flat=True)) == [
        "dad"
    ]


def test_the_site_urls_are_checked_without_showing_their_secrets(settings):
    settings.PIPPA_NOTIFY_URLS = [
        "mailtos://user:s3cret@smtp.example.org?from=pippa@example.org",
        "ntfys://ntfy.sh/everyone",
        "mailto://",
    ]
    problems = notify_site_problems()
    assert problems == [
        ERR_SITE_URL_UNUSED.format(n=2, scheme="ntfys"),
        ERR_SITE_URL_BAD.format(n=3, scheme="mailto"),
    ]
    assert "s3cret" not in " ".join(problems)
