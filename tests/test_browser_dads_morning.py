"""Dad's morning, in a real Chromium against the live server and its worker
(issue 50's "Done when").

One walk, one login a browser (the login view throttles successful logins
from one address too): the demo loaded as ``make run`` loads it, a task of
his whose outside call a killed worker left open, a real SMTP server on
loopback for his e-mail. He finds "Notifications" in the header and gives
his address; the worker sets the step aside and mails him; the e-mail's HTML
part links to the decision, which survives the login on the way; he chooses
"Stop here", and focus goes to the message saying so; the stopped step is off
his to-do list. Then every page he can reach, at 390 px: no sideways scroll;
and the task, artifact and council pages say nothing in an exception's name
and show no JSON outside the engineer's folds.
"""

from __future__ import annotations

import re
import subprocess
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from playwright.sync_api import expect

from tasks.models import Step, Task
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.executing import expire_lease
from tests.support.receivers import SmtpSink
from tests.support.workers import tools_env, worker_argv

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
PASSWORD = "dad-demo-password"
# What only an engineer should read: an exception's class, and JSON.
EXCEPTION = re.compile(r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b")
# The page's text outside the engineer's folds (details.engineer, and the
# event log, an engineer's view folded under the steps), with the other
# folds opened as Dad would open them.
SHOWN_TEXT = """() => {
  document.querySelectorAll('details:not(.engineer):not(#events-fold)')
    .forEach(d => { d.open = true; });
  const main = document.querySelector('main').cloneNode(true);
  main.querySelectorAll('details.engineer, #events-fold').forEach(d => d.remove());
  return main.innerText;
}"""
NO_SIDEWAYS_SCROLL = "document.documentElement.scrollWidth <= window.innerWidth"
SKIP = (
    "/logout",
    "/admin",
    "/api/",
    "/mcp",
    "/preview",
    "saved-output",
    "resume-context",
    ".json",
    "/off/",
)
RAW_SOURCE = re.compile(r"/artifacts/\d+/source$")  # the file itself, a download


@pytest.fixture
def smtp(settings):
    sink = SmtpSink().start()
    settings.PIPPA_NOTIFY_URLS = [sink.url]
    settings.PIPPA_NOTIFY_DELAY_SECONDS = 0
    yield sink
    sink.stop()


def _worker(env: dict, *, task_id: int, crashpoint: str = "") -> int:
    run = subprocess.run(
        worker_argv(task_id, worker_id=f"worker:morning-{crashpoint or 'next'}"),
        cwd=REPO,
        env=tools_env(env, crashpoint=crashpoint),
        capture_output=True,
        text=True,
        timeout=180,
    )
    return run.returncode


def _log_in(page, base: str) -> None:
    page.fill("#id_username", "dad")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def _crawl(page, base: str, limit: int = 60) -> list[str]:
    """Every page of Dad's reachable from home by links (no downloads or JSON)."""
    seen, queue = [], ["/"]
    while queue and len(seen) < limit:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.append(path)
        page.goto(f"{base}{path}")
        for href in page.eval_on_selector_all(
            "main a[href], header a[href]",
            "els => els.map(e => e.getAttribute('href'))",
        ):
            href = href.split("#")[0]
            if href.startswith(base):
                href = href[len(base) :]
            if not href.startswith("/") or any(s in href for s in SKIP):
                continue
            if RAW_SOURCE.search(href):
                continue
            if href not in seen and href not in queue:
                queue.append(href)
    return seen


def test_dads_morning_finds_what_the_issue_asked_for(
    browser, live_server, smtp, subprocess_env, tool_log, settings
):
    base = live_server.url
    settings.PIPPA_SITE_URL = base
    call_command("pippa_demo", verbosity=0)
    dad = get_user_model().objects.get(username="dad")
    invoice = task_create(
        conversation=Task.objects.filter(conversation__owner=dad).first().conversation,
        title="Send the invoice",
        steps=[{"title": "E-mail the invoice", "tool": "test.effect", "args": {}}],
    )
    env = {
        **subprocess_env,
        "PIPPA_NOTIFY_URLS": smtp.url,
        "PIPPA_NOTIFY_DELAY_SECONDS": "0",
        "PIPPA_SITE_URL": base,
        "PIPPA_TOOL_LOG": str(tool_log),
    }

    desk = browser.new_context(viewport=DESKTOP)
    page = desk.new_page()
    page.goto(f"{base}/login/")
    _log_in(page, base)
    page.wait_for_url(f"{base}/")

    # 1. "Notifications" in the header; the box comes ticked; his address saved.
    page.get_by_role("navigation", name="Main").get_by_role(
        "link", name="Notifications"
    ).click()
    expect(page.locator("#notify-enabled")).to_be_checked()
    page.fill("#notify-addresses", "dad@example.org")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#messages")).to_contain_text(
        "you will be told when a step waits for you"
    )

    # 2. A worker dies in the middle of the outside call; the next one sets
    #    the step aside and mails him, one multipart message.
    assert _worker(env, task_id=invoice.pk, crashpoint="after_tool") != 0
    expire_lease(invoice.pk)
    assert _worker(env, task_id=invoice.pk) == 0
    step = Step.objects.get(task=invoice)
    assert step.status == Step.Status.NEEDS_REVIEW
    [mail] = smtp.to("dad@example.org")
    decide = f"{base}/tasks/{invoice.pk}/decide/1/"
    assert f'<a href="{decide}"' in mail.part("html")
    assert f"   Decide: {decide}" in mail.part("plain").splitlines()
    assert not EXCEPTION.search(mail.part("plain") + mail.part("html"))
    assert mail.headers("List-Unsubscribe-Post") == ["List-Unsubscribe=One-Click"]

    # 3. The link, followed from the mail in a browser that is not logged in,
    #    survives the login and opens the card.
    phone = browser.new_context(viewport=PHONE)
    mobile = phone.new_page()
    mobile.goto(decide)
    assert urlsplit(mobile.url).path == "/login/"
    _log_in(mobile, base)
    mobile.wait_for_url(re.compile(rf"/tasks/{invoice.pk}/#attention-1$"))
    card = mobile.locator("#attention-1")
    expect(card).to_be_visible()
    expect(card).to_contain_text("Step 1 needs you")

    # 4. "Stop here": the message says so and has the focus; the step is
    #    "stopped by you", with its other ways still offered.
    card.locator(f"#choose-{step.pk}-fail").click()
    expect(mobile.locator("#messages")).to_contain_text("Step 1")
    expect(mobile.locator("#attention-1")).to_contain_text("stopped by you")
    # Focus moves once htmx has settled the swap (a moment after the text shows).
    expect(mobile.locator("#messages")).to_be_focused()
    expect(mobile.locator(f"#choose-{step.pk}-skip")).to_be_visible()
    step.refresh_from_db()
    assert step.stopped

    # 5. Off the to-do list.
    mobile.goto(f"{base}/")
    todo = mobile.locator("#todo")
    expect(todo).to_be_visible()
    assert f"/tasks/{invoice.pk}/" not in todo.inner_html()
    assert "Send the invoice" not in todo.inner_text()

    # 6. Every page he can reach: no sideways scroll at 390 px; no
    #    exception's name and no JSON outside the engineer's folds on the
    #    task, artifact and council pages.
    pages = _crawl(mobile, base)
    assert any(p.startswith("/tasks/") for p in pages)
    assert any(p.startswith("/artifacts/") for p in pages)
    assert any(p.startswith("/council/") for p in pages)
    assert "/settings/notifications/" in pages
    wide, engineer_words = [], {}
    for path in pages:
        mobile.goto(f"{base}{path}")
        mobile.wait_for_load_state("networkidle")
        if not mobile.evaluate(NO_SIDEWAYS_SCROLL):
            wide.append((path, mobile.evaluate("document.documentElement.scrollWidth")))
        # The task, artifact and council pages (an artifact's source as text
        # is the raw file by its own choice).
        if path.startswith(
            ("/tasks/", "/artifacts/", "/council/")
        ) and not path.endswith("/source/text"):
            shown = mobile.evaluate(SHOWN_TEXT)
            found = EXCEPTION.findall(shown) + (["{"] if "{" in shown else [])
            if found:
                engineer_words[path] = sorted(set(found))
    desk.close()
    phone.close()
    assert wide == [], wide
    assert engineer_words == {}, engineer_words
