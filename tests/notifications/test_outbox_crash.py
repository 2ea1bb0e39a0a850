"""Notifications across real kills: worker processes SIGKILLed mid-step and mid-delivery.

A real SMTP server (aiosmtpd) listens in the test process; ``pippa_worker``
subprocesses send to it through Apprise, armed with ``PIPPA_CRASHPOINT`` to
kill themselves with SIGKILL at a boundary.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest

from notifications.models import Notice
from notifications.outbox import message_id_header, notify_settings_save
from tasks.actions import step_resolve
from tasks.models import Step
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.executing import expire_lease, invocations
from tests.support.receivers import SmtpSink
from tests.support.workers import tools_env, worker_argv

pytestmark = pytest.mark.slow

DECIDE = re.compile(r"http://testserver(/tasks/\d+/decide/\d+/)")


@pytest.fixture
def smtp(settings):
    sink = SmtpSink().start()
    settings.PIPPA_NOTIFY_URLS = [sink.url]
    settings.PIPPA_SITE_URL = "http://testserver"
    yield sink
    sink.stop()


@pytest.fixture
def worker(subprocess_env, tmp_path, smtp, tool_log):
    def run(*, crashpoint: str = "", name: str = "w", claim_seconds: int = 120):
        env = tools_env(
            subprocess_env,
            tool_log,
            PIPPA_NOTIFY_URLS=smtp.url,
            PIPPA_NOTIFY_DELAY_SECONDS="0",
            PIPPA_NOTIFY_CLAIM_SECONDS=str(claim_seconds),
            PIPPA_SITE_URL="http://testserver",
            crashpoint=crashpoint,
        )
        proc = subprocess.run(
            worker_argv(worker_id=f"worker:{name}"),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return proc.returncode, proc.stderr

    return run


@pytest.mark.django_db(transaction=True)
def test_a_step_left_by_a_killed_worker_reaches_its_owner_once_even_when_the_sender_is_killed(
    make_user, make_conversation, worker, smtp, tool_log, client
):
    dad, mum = make_user(username="dad"), make_user(username="mum")
    notify_settings_save(user=dad, enabled=True, addresses="dad@example.org")
    notify_settings_save(user=mum, enabled=True, addresses="mum@example.org")
    task = task_create(
        conversation=make_conversation(owner=dad),
        title="Pay the plumber",
        steps=[{"title": "Send the payment", "tool": "test.effect", "args": {}}],
    )
    task_create(
        conversation=make_conversation(owner=mum),
        title="Mum's prices",
        steps=[{"title": "fetch", "tool": "test.fetch", "args": {}}],
    )

    # 1. The first worker dies right after the outside call, before its
    #    result is saved: the payment went out, nobody knows it did.
    code, err = worker(crashpoint="after_tool", name="first")
    assert code == -signal.SIGKILL, err
    assert smtp.mails == []
    expire_lease(task.pk)

    # 2. The next one sets the step aside, sends the message, and is killed
    #    before it can record that it did.
    code, err = worker(crashpoint="after_notify_sent", name="second", claim_seconds=1)
    assert code == -signal.SIGKILL, err
    step = Step.objects.get(task=task)
    assert step.status == Step.Status.NEEDS_REVIEW
    assert invocations(tool_log, "test.effect") == {step.pk: 1}
    notice = Notice.objects.get()
    assert (notice.owner, notice.state) == (dad, Notice.State.PENDING)
    assert len(smtp.to("dad@example.org")) == 1
    time.sleep(1.2)  # the dead sender's claim runs out

    # 3. A fresh worker sends it again, under the same Message-ID.
    code, err = worker(name="third")
    assert code == 0, err
    first, repeat = smtp.to("dad@example.org")
    assert first.headers("Message-ID") == repeat.headers("Message-ID")
    assert first.headers("Message-ID") == [message_id_header(notice.message_id)]
    assert Notice.objects.get().state == Notice.State.SENT

    # The link opens Dad's decision card, and nobody else's page.
    [path] = set(DECIDE.findall(first.body))
    client.force_login(dad)
    card = client.get(path)
    page_path, _, anchor = card["Location"].partition("#")
    page = client.get(page_path)
    assert page.status_code == 200
    assert f'id="{anchor}"'.encode() in page.content
    client.force_login(mum)
    assert client.get(path).status_code == 404
    assert client.get(page_path).status_code == 404

    # 4. Dad decides; nothing more goes out, to anyone.
    step_resolve(step=step, action="skip", actor="dad")
    code, err = worker(name="fourth")
    assert code == 0, err
    assert len(smtp.mails) == 2
    assert smtp.to("mum@example.org") == []
    assert Notice.objects.count() == 1
