"""Screenshots of the main pages (README, docs/look.md), at 1280 and 390 px wide.

Skipped unless PIPPA_DOCS_SCREENSHOTS=1 (``make screenshots``): it writes
docs/screenshots/*.png from the same demo data the browser tests use, cut to a
screen's height and reduced to a 256-colour palette to keep the files small.
"""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image
from playwright.sync_api import expect

from api.services import token_create
from council.demo import demo_round_load
from council.models import Turn
from tests.conftest import REPO
from tests.support.oauth import consent_path, grant_for
from tests.tasks.dashboard_data import showcase

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("PIPPA_DOCS_SCREENSHOTS") != "1",
        reason="writes docs/screenshots; run with PIPPA_DOCS_SCREENSHOTS=1",
    ),
]

OUT = REPO / "docs" / "screenshots"
SIZES = {"1280": (1280, 900), "390": (390, 844)}
MAX_HEIGHT = {"1280": 1100, "390": 1500}  # css px kept from the top of the page


def _save(page, name: str, width: str) -> None:
    png = page.screenshot(full_page=True, scale="css")
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.crop((0, 0, image.width, min(image.height, MAX_HEIGHT[width])))
    small = image.quantize(
        colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )
    small.save(OUT / f"{name}-{width}.png", optimize=True)


def test_take_the_readme_screenshots(
    browser, live_server, make_user, make_conversation, make_task
):
    OUT.mkdir(parents=True, exist_ok=True)
    dad = make_user(username="dad")
    data = showcase(dad, make_conversation, make_task)
    council_round = demo_round_load(owner=dad)
    widget = next(
        link.artifact
        for t in Turn.objects.filter(round=council_round)
        for link in t.artifact_links.all()
        if link.artifact.media_type == "image/svg+xml"
    )
    token_create(user=dad, name="codex runner on the laptop")
    grant_for(dad, name="Claude Code")
    _, sign_in = consent_path(name="Claude Code", base=live_server.url)
    pages = {
        "conversations": "/",
        "conversation": data["conversation"].get_absolute_url(),
        "task-needs-you": data["review"].get_absolute_url(),
        "task-running": data["running"].get_absolute_url(),
        "task-done": data["done"].get_absolute_url(),
        "artifact": widget.get_absolute_url(),
        "council-round": council_round.get_absolute_url(),
        "tokens": "/settings/tokens/",
        "mcp-sign-in": sign_in,
        "notifications": "/settings/notifications/",
    }
    # One login, its session reused (the login view throttles logins too).
    login = browser.new_context()
    page = login.new_page()
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", dad.username)
    page.fill("#id_password", "correct horse battery staple")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    session = login.storage_state()
    login.close()
    for scheme in ("light", "dark"):
        for width, (w, h) in SIZES.items():
            context = browser.new_context(
                viewport={"width": w, "height": h},
                color_scheme=scheme,
                storage_state=session,
            )
            page = context.new_page()
            for name, path in pages.items():
                if scheme == "dark" and name not in ("task-needs-you", "artifact"):
                    continue
                page.goto(f"{live_server.url}{path}")
                page.wait_for_load_state("networkidle")
                expect(page.locator("h1")).to_be_visible()
                _save(page, name if scheme == "light" else f"{name}-dark", width)
            context.close()
