"""axe-core, injected by the browser tests, finds no violations on Dad's pages.

axe-core comes from the npm registry (``.ci/install-axe`` puts it in var/axe).
The site's CSP refuses injected script, so axe runs in a browser context made
with ``bypass_csp=True``; the CSP itself is checked by other tests. Every page
is checked in the light and the dark colour scheme, at 1280 and 390 px, with
its folds opened.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from django.urls import reverse

from api.models import OAuthGrant
from api.services import token_create
from artifacts.models import ArtifactClass
from artifacts.services import artifact_store
from council.demo import demo_round_load
from council.models import Turn
from council.services import round_start, turn_add
from notifications.outbox import notify_unsubscribe_token
from tasks.actions import step_resolve
from tasks.plan import task_create
from tests.conftest import REPO
from tests.support.executing import crash_at, expire_lease
from tests.support.oauth import consent_path, grant_for
from tests.tasks.dashboard_data import showcase

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = REPO / "var" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
# WCAG 2.1 A and AA, plus axe's best practices (landmarks, heading order...).
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
RUN_AXE = """async (tags) => {
  const result = await axe.run(document, {runOnly: {type: "tag", values: tags}});
  return result.violations.map(v => ({
    rule: v.id, impact: v.impact, help: v.help,
    where: v.nodes.slice(0, 4).map(n => n.target.join(" ") + " | " + n.failureSummary),
  }));
}"""


@pytest.fixture(scope="session")
def axe_script() -> str:
    if not AXE.exists():
        subprocess.run(["bash", str(REPO / ".ci" / "install-axe")], check=False)
    if not AXE.exists():
        pytest.skip("axe-core is not installed (run .ci/install-axe)")
    return AXE.read_text()


@pytest.fixture
def dads_pages(
    make_user, make_conversation, make_task
) -> tuple[object, dict[str, str]]:
    """Dad's data and the pages to check: name -> path."""
    dad = make_user(username="dad-axe")
    data = showcase(dad, make_conversation, make_task)
    council_round = demo_round_load(owner=dad)
    turn = Turn.objects.filter(round=council_round).order_by("-order").first()
    widget = next(
        link.artifact
        for t in Turn.objects.filter(round=council_round)
        for link in t.artifact_links.all()
        if link.artifact.media_type == "image/svg+xml"
    )
    token = token_create(user=dad, name="laptop runner").token
    grant_for(dad, name="Claude Code")
    _, consent = consent_path(name="Codex")
    conversation = data["conversation"]
    stopped = _stopped_task(conversation)
    search = _saved_search(dad, data["done"])
    open_round = round_start(
        conversation=council_round.conversation,
        topic="Which quotes for the sump pump?",
        participants=[("Ada", "claude"), ("Kit", "kimi")],
    )
    turn_add(
        council_round=open_round,
        participant=open_round.participants.get(name="Ada"),
        text="Two quotes came in; the cheaper one has no warranty.",
    )
    outside = data["review"].steps.get(position=2)  # sends an email: confirmed first
    return dad, {
        "conversation list": "/",
        "conversations that need Dad": "/?needs=you",
        "conversation": conversation.get_absolute_url(),
        "running task": data["running"].get_absolute_url(),
        "task that needs Dad": data["review"].get_absolute_url(),
        "finished task": data["done"].get_absolute_url(),
        "artifact with lineage": widget.get_absolute_url(),
        "artifact source": f"/artifacts/{widget.pk}/source/text",
        "council round": council_round.get_absolute_url(),
        "context a turn received": f"/council/turns/{turn.pk}/context/",
        "API tokens": "/settings/tokens/",
        "revoke a token": f"/settings/tokens/{token.pk}/revoke/",
        "an MCP client asks to sign in": consent,
        "sign an MCP client out": reverse(
            "tokens:revoke_grant", args=[OAuthGrant.objects.get(user=dad).pk]
        ),
        "delete a conversation": f"/conversations/{conversation.pk}/delete/",
        "confirm sending again": reverse(
            "dashboard:step_resolve", args=[data["review"].pk, outside.pk]
        )
        + "?action=rerun",
        "confirm a new call": reverse(
            "dashboard:step_retry", args=[data["review"].pk, outside.pk]
        ),
        "confirm a branch": reverse("dashboard:task_branch", args=[data["done"].pk])
        + "?after_position=1",
        "confirm cancelling": reverse(
            "dashboard:task_cancel", args=[data["running"].pk]
        ),
        "page not found": "/conversations/999999/",
        "notifications": reverse("notify_settings"),
        "turn messages off": reverse(
            "notify_off", args=[notify_unsubscribe_token(dad.pk)]
        ),
        "a task with a step Dad stopped": stopped.get_absolute_url(),
        "a saved search": search.get_absolute_url(),
        "a round with no conclusion yet": open_round.get_absolute_url(),
    }


def _stopped_task(conversation):
    """A task whose interrupted search Dad stopped ("Stop here")."""
    task = task_create(
        conversation=conversation,
        title="Search, then stopped",
        steps=[{"title": "Search the news", "tool": "demo.search", "args": {}}],
    )
    crash_at(task.pk, "after_started", "worker:axe")
    expire_lease(task.pk)
    step_resolve(step=task.steps.get(), action="fail", actor="user:dad-axe")
    return task


def _saved_search(dad, task):
    search = artifact_store(
        owner=dad,
        data=json.dumps(
            {"query": "tomatoes", "results": [{"title": "Tomato prices fall"}]}
        ).encode(),
        media_type="application/json",
        artifact_class=ArtifactClass.SNAPSHOT,
        title="Search: tomatoes",
    )
    task.artifact_links.create(artifact=search)
    return search


def _violations(page, axe_script: str) -> list[dict]:
    page.add_script_tag(content=axe_script)
    return page.evaluate(RUN_AXE, AXE_TAGS)


def _open_folds(page) -> None:
    """Open every <details>, so what loads into a fold is checked too."""
    page.evaluate(
        "document.querySelectorAll('details').forEach(d => { d.open = true; })"
    )
    page.wait_for_load_state("networkidle")


# Every page at both widths, in both schemes: one login (the login view
# throttles successful logins from one address too), its session reused.
LOOKS = [
    ("light", {"width": 1280, "height": 900}),
    ("dark", {"width": 1280, "height": 900}),
    ("light", {"width": 390, "height": 844}),
    ("dark", {"width": 390, "height": 844}),
]


def test_axe_finds_no_violations_on_dads_pages_in_both_schemes_at_both_widths(
    browser, live_server, dads_pages, axe_script
):
    dad, pages = dads_pages
    found: dict[str, list[dict]] = {}
    login = browser.new_context(bypass_csp=True)
    page = login.new_page()
    page.goto(f"{live_server.url}/login/")
    if problems := _violations(page, axe_script):
        found["login"] = problems
    page.fill("#id_username", dad.username)
    page.fill("#id_password", "correct horse battery staple")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    session = login.storage_state()
    login.close()
    for scheme, viewport in LOOKS:
        look = f"{scheme}, {viewport['width']} px"
        context = browser.new_context(
            bypass_csp=True,
            color_scheme=scheme,
            viewport=viewport,
            storage_state=session,
        )
        page = context.new_page()
        try:
            for name, path in pages.items():
                response = page.goto(f"{live_server.url}{path}")
                expected = 404 if name == "page not found" else 200
                assert response.status == expected, (name, path, response.status)
                page.wait_for_load_state("networkidle")
                _open_folds(page)
                if problems := _violations(page, axe_script):
                    found[f"{name} ({look})"] = problems
        finally:
            context.close()
    assert not found, json.dumps(found, indent=1, ensure_ascii=False)


def test_the_dark_scheme_really_changes_the_page(browser, live_server):
    """The check above runs in dark mode, not in light mode twice."""
    colours = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(color_scheme=scheme)
        page = context.new_page()
        page.goto(f"{live_server.url}/login/")
        colours[scheme] = page.evaluate(
            "getComputedStyle(document.body).backgroundColor"
        )
        context.close()
    assert colours == {"light": "rgb(246, 247, 249)", "dark": "rgb(17, 20, 26)"}
