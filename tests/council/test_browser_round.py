"""The round viewer in a real Chromium: previews show, widget script never runs."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from artifacts.models import Artifact
from council.demo import demo_round_load
from council.services import turn_add

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Tries every way an SVG's script could reach the dashboard's origin.
HOSTILE_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="240" height="120" '
    b"onload=\"fetch('/pwned-onload')\">"
    b"<script>top.document.title='pwned'; parent.document.title='pwned';"
    b"document.title='pwned'; fetch('/pwned-script'); alert('pwned');</script>"
    b'<rect width="240" height="120" fill="#f6b3ad"/>'
    b'<text x="20" y="65" font-size="20">hostile widget</text></svg>'
)


def _watch(page) -> dict:
    seen = {"requests": [], "dialogs": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("framenavigated", lambda f: None)

    def on_dialog(dialog):
        seen["dialogs"].append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return seen


def _no_script_ran(page, seen) -> None:
    assert "pwned" not in page.title()
    assert seen["dialogs"] == []
    assert not [u for u in seen["requests"] if "pwned" in u]


def _reopened(council_round):
    """The demo's round, its outcome taken back, so a test can add a late turn
    (a concluded round takes no more)."""
    type(council_round).objects.filter(pk=council_round.pk).update(
        outcome="", concluded_at=None, concluded_by=""
    )
    council_round.refresh_from_db()
    return council_round


def test_round_viewer_shows_previews_and_never_runs_the_widgets_script(
    logged_in_page, screenshot
):
    page = logged_in_page
    council_round = _reopened(demo_round_load(owner=page.user))
    turn_add(
        council_round=council_round,
        participant=council_round.participants.get(name="Ada"),
        text="A widget that tries to run script.",
        widget=HOSTILE_SVG,
        widget_title="Hostile widget",
    )
    hostile = Artifact.objects.get(title="Hostile widget")
    seen = _watch(page)

    page.goto(f"{page.base_url}{council_round.get_absolute_url()}")
    images = page.locator("img.widget-preview")
    images.first.wait_for()
    page.wait_for_load_state("networkidle")

    assert images.count() == 2  # the risk map and the hostile widget
    for i in range(images.count()):
        assert images.nth(i).is_visible()
        assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")
    fold = page.locator("details.context").nth(1)
    fold.locator("summary").first.click()
    # The fold fetches its context when opened: words first, the JSON with
    # its refs marked under the engineer's fold.
    expect(fold.locator(".context-words")).to_contain_text("Ada’s words, with")
    fold.locator("details.engineer summary").click()
    expect(fold.locator("mark.ref").first).to_be_visible()
    screenshot(page, "council-round-viewer")
    _no_script_ran(page, seen)

    # Click the hostile preview: the source view shows the script as text.
    page.locator(f'figure[data-artifact="{hostile.pk}"] a:has(img)').click()
    page.wait_for_url(f"**/artifacts/{hostile.pk}/source/text")
    assert (
        "<script>top.document.title='pwned'"
        in page.locator("pre.source-text").inner_text()
    )
    screenshot(page, "council-widget-source-text")
    _no_script_ran(page, seen)

    # The raw source is a download, never a document in our origin.
    with page.expect_download() as download_info:
        page.click("a[download]")
    assert download_info.value.suggested_filename.endswith(".svg")
    _no_script_ran(page, seen)

    # Even framed by hand from the dashboard, the raw SVG cannot run script
    # (sandbox CSP, X-Frame-Options DENY).
    page.evaluate(
        "url => { const f = document.createElement('iframe'); f.src = url;"
        " document.body.appendChild(f); }",
        f"/artifacts/{hostile.pk}/source",
    )
    page.wait_for_timeout(500)
    _no_script_ran(page, seen)


def test_round_viewer_says_why_a_preview_failed(logged_in_page, screenshot):
    page = logged_in_page
    council_round = _reopened(demo_round_load(owner=page.user))
    turn_add(
        council_round=council_round,
        participant=council_round.participants.get(name="Kit"),
        text="My chart is broken.",
        widget=b'<!DOCTYPE svg [<!ENTITY x "y">]><svg xmlns="http://www.w3.org/2000/svg"/>',
        widget_title="Broken chart",
    )

    page.goto(f"{page.base_url}{council_round.get_absolute_url()}")

    note = page.locator(".preview-failed")
    assert note.is_visible()
    assert "DTD, entity or external declarations are refused" in note.inner_text()
    screenshot(page, "council-round-failed-preview")


def test_artifact_detail_page_shows_the_preview_and_verifies(
    logged_in_page, screenshot
):
    page = logged_in_page
    council_round = demo_round_load(owner=page.user)
    widget = Artifact.objects.get(title="Household risk map")

    page.goto(f"{page.base_url}/artifacts/{widget.pk}/")
    image = page.locator("img.detail-preview")
    image.wait_for()
    assert image.evaluate("img => img.complete && img.naturalWidth > 0")
    # The picture comes first; the class and the hashes are an engineer's details.
    page.get_by_text("Details for an engineer").click()
    expect(page.locator("details.engineer .facts")).to_contain_text("render")
    page.click("text=Verify now")
    page.wait_for_url(f"**/artifacts/{widget.pk}/")
    assert "Verified: the blob matches its sha256." in page.content()
    screenshot(page, "artifact-detail")
    assert council_round.pk
