"""Site-wide presentation: error pages, one date format, breadcrumbs, messages, tokens."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.template import Context, Template
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone
from django.views.defaults import permission_denied, server_error

from api.models import ApiToken
from api.services import token_create
from council.models import Turn
from council.services import round_start, turn_add
from tasks.models import Task
from tasks.plan import task_create
from tests.support.oauth import grant_for
from tests.tasks.dashboard_data import add_steps

pytestmark = pytest.mark.django_db


def _render(source: str, **context) -> str:
    return Template("{% load pippa %}" + source).render(Context(context))


# -- error pages ---------------------------------------------------------------


def test_a_missing_page_is_a_styled_404_with_the_navigation_and_a_way_back(
    dad_client,
):
    response = dad_client.get("/conversations/999999/")
    body = response.content.decode()
    assert response.status_code == 404
    assert '<h1 id="error-heading">Nothing here</h1>' in body
    assert '<nav aria-label="Main">' in body
    assert 'href="/settings/tokens/">API tokens</a>' in body
    assert '<a class="button primary" href="/">Back to your conversations</a>' in body
    assert 'href="/static/css/pippa.css"' in body


def _unsalted(body: bytes) -> str:
    """The page without its per-request CSRF token and CSP nonce."""
    return re.sub(r'(x-csrftoken": "|value="|nonce=")[^"]+', r"\1", body.decode())


def test_another_users_conversation_gets_the_same_404_as_a_missing_one(
    client, make_user, make_conversation
):
    theirs = make_conversation(owner=make_user(), title="Their secret plans")
    client.force_login(make_user())
    other = client.get(theirs.get_absolute_url())
    missing = client.get("/conversations/999999/")
    assert other.status_code == missing.status_code == 404
    assert "Their secret plans" not in other.content.decode()
    assert _unsalted(other.content) == _unsalted(missing.content)


def test_a_404_for_someone_logged_out_offers_the_way_back_without_a_menu(client):
    response = client.get("/no/such/page/")
    body = response.content.decode()
    assert response.status_code == 404
    assert "Back to your conversations" in body
    assert "Log out" not in body


def test_the_403_page_has_the_navigation_and_a_way_back(user):
    request = RequestFactory().get("/somewhere/")
    request.user = user
    response = permission_denied(request, PermissionDenied("no"))
    body = response.content.decode()
    assert response.status_code == 403
    assert "Not allowed" in body
    assert "Back to your conversations" in body
    assert f"Log out {user.username}" in body


def test_the_500_page_renders_without_a_request_and_reassures(user):
    response = server_error(RequestFactory().get("/"))
    body = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on our side" in body
    assert "nothing was lost" in body
    assert '<nav aria-label="Main"><a href="/">Conversations</a></nav>' in body
    assert "Back to your conversations" in body


# -- one date format ---------------------------------------------------------


@pytest.mark.parametrize(
    ("ago", "words"),
    [
        (timedelta(0), "just now"),
        (timedelta(seconds=42), "42 s ago"),
        (timedelta(minutes=5, seconds=3), "5 min ago"),
        (timedelta(hours=2), "2 h ago"),
        (timedelta(hours=2, minutes=7), "2 h 7 min ago"),
        (timedelta(days=1, hours=1), "1 day ago"),
        (timedelta(days=3), "3 days ago"),
        (timedelta(minutes=-3, seconds=-30), "in 3 min"),
    ],
)
def test_when_says_how_long_ago_and_keeps_the_exact_time_on_hover(ago, words):
    value = timezone.now() - ago
    html = _render("{{ value|when }}", value=value)
    match = re.fullmatch(
        r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', html
    )
    assert match, html
    assert match[1] == value.isoformat()
    assert match[2] == timezone.localtime(value).strftime("%a %-d %b %Y, %H:%M:%S UTC")
    assert match[3] == words


def test_when_shows_the_date_itself_after_a_week_and_nothing_for_none():
    value = timezone.now().replace(year=2025, month=3, day=12)
    assert ">12 Mar 2025</time>" in _render("{{ value|when }}", value=value)
    assert _render("{{ value|when }}", value=None) == ""


def test_artifact_round_and_token_pages_use_the_one_date_format(
    dad_client, user, make_conversation, make_task
):
    task = make_task(conversation=make_conversation(owner=user), title="Prices")
    artifact = add_steps(task, 1, done=1)[0].output
    token_create(user=user, name="laptop")
    for url in (artifact.get_absolute_url(), reverse("tokens:list")):
        body = dad_client.get(url).content.decode()
        assert re.search(
            r'<time datetime="[^"]+" title="[^"]+ UTC">just now</time>', body
        ), url


# -- breadcrumbs -------------------------------------------------------------


def _crumbs(body: str) -> list[str]:
    nav = re.search(
        r'<nav class="crumbs" aria-label="Breadcrumb">(.*?)</nav>', body, re.S
    )
    assert nav, "no breadcrumb"
    return [
        re.sub(r"<[^>]+>", "", li).strip()
        for li in re.findall(r"<li>(.*?)</li>", nav[1], re.S)
    ]


def test_an_artifact_page_has_the_full_trail_through_its_task(
    dad_client, user, make_conversation, make_task
):
    conversation = make_conversation(owner=user, title="Tomatoes")
    task = make_task(conversation=conversation, title="Chart prices")
    artifact = add_steps(task, 1, done=1)[0].output
    body = dad_client.get(artifact.get_absolute_url()).content.decode()
    assert _crumbs(body) == [
        "Conversations",
        "Tomatoes",
        "Chart prices",
        artifact.title,
    ]
    assert f'href="{conversation.get_absolute_url()}"' in body
    assert f'href="{task.get_absolute_url()}"' in body
    assert f'<span aria-current="page"><bdi>{artifact.title}</bdi></span>' in body
    source = dad_client.get(reverse("artifacts:source_text", args=[artifact.pk]))
    assert _crumbs(source.content.decode())[-2:] == [artifact.title, "Source"]


def test_a_council_artifact_and_round_have_the_full_trail(
    dad_client, user, make_conversation
):
    from tests.tasks.dashboard_data import SVG_WIDGET

    conversation = make_conversation(owner=user, title="Household")
    council_round = round_start(
        conversation=conversation, topic="Risks", participants=[("Ada", "claude")]
    )
    turn_add(
        council_round=council_round,
        participant=council_round.participants.get(),
        text="A map.",
        widget=SVG_WIDGET,
        widget_title="Risk map",
    )
    round_body = dad_client.get(council_round.get_absolute_url()).content.decode()
    assert _crumbs(round_body) == ["Conversations", "Household", "Round 1: Risks"]
    widget = Turn.objects.get().artifact_links.get(artifact__title="Risk map").artifact
    body = dad_client.get(widget.get_absolute_url()).content.decode()
    assert _crumbs(body) == [
        "Conversations",
        "Household",
        "Round 1: Risks",
        "Turn 1 by Ada",
        "Risk map",
    ]
    assert f'href="{council_round.get_absolute_url()}#turn-1"' in body


def test_the_breadcrumb_tag_escapes_titles():
    html = _render("{% breadcrumbs None here=title %}", title="<b>x</b>")
    assert "&lt;b&gt;x&lt;/b&gt;" in html
    assert "<b>x" not in html


# -- messages survive polls ----------------------------------------------------


def _poll(client, task: Task):
    return client.get(
        task.get_absolute_url(), headers={"HX-Request": "true", "HX-Target": "timeline"}
    )


def test_a_message_is_not_wiped_by_a_poll_and_shows_on_the_next_page(
    dad_client, user, make_conversation, make_task
):
    running = make_task(
        conversation=make_conversation(owner=user), status=Task.Status.RUNNING
    )
    add_steps(running, 2, done=1)
    new = token_create(user=user, name="laptop")
    dad_client.post(reverse("tokens:revoke", args=[new.token.pk]))
    poll = _poll(dad_client, running)
    assert poll.status_code == 200
    assert "revoked" not in poll.content.decode()
    page = dad_client.get(reverse("tokens:list"))
    assert "Token “laptop” revoked." in page.content.decode()
    again = dad_client.get(reverse("tokens:list"))
    assert "revoked." not in again.content.decode()  # shown once


def test_an_htmx_action_shows_its_message_out_of_band_and_the_poll_keeps_it(
    dad_client, user, make_conversation
):
    task = task_create(
        conversation=make_conversation(owner=user),
        title="Later",
        steps=[{"title": "Fetch", "tool": "demo.closes", "args": {}}],
        queue=False,
    )
    answer = dad_client.post(
        reverse("dashboard:task_resume", args=[task.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    oob = re.search(
        r'<div id="messages"[^>]*hx-swap-oob="true"[^>]*>(.*?)</div>', answer, re.S
    )
    assert oob
    assert "Queued “Later” for the worker." in oob[1]
    # The poll swaps only the timeline: no messages in it to wipe or repeat.
    poll = _poll(dad_client, task).content.decode()
    assert 'id="messages"' not in poll
    assert "Queued" not in poll
    # Shown once: the next full page does not repeat it.
    assert (
        "Queued “Later”" not in dad_client.get(task.get_absolute_url()).content.decode()
    )


# -- tokens ------------------------------------------------------------------


def test_a_new_token_has_a_copy_button_from_a_static_script(dad_client):
    response = dad_client.post(reverse("tokens:new"), {"name": "laptop"}, follow=True)
    body = response.content.decode()
    assert re.search(r'<input [^>]*id="new-token"', body)
    assert '<button type="button" id="copy-token" data-copy="new-token"' in body
    assert re.search(
        r'<script src="/static/js/copy\.js" defer nonce="[^"]+"></script>', body
    )
    assert "<script>" not in body  # no inline script


def test_revoking_a_token_asks_first_and_keeps_it_until_confirmed(dad_client, user):
    new = token_create(user=user, name="laptop")
    url = reverse("tokens:revoke", args=[new.token.pk])
    listing = dad_client.get(reverse("tokens:list")).content.decode()
    assert f'href="{url}">Revoke…' in listing
    page = dad_client.get(url)
    body = page.content.decode()
    assert page.status_code == 200
    assert "Revoke the token “<bdi>laptop</bdi>”?" in body
    assert "refused from its next request on" in body
    assert "Cancel, keep it" in body
    assert ApiToken.objects.get(pk=new.token.pk).revoked_at is None
    dad_client.post(url)
    assert ApiToken.objects.get(pk=new.token.pk).revoked_at is not None
    again = dad_client.get(url, follow=True).content.decode()
    assert "that token is already revoked" in again


def test_nobody_sees_the_revoke_page_of_another_users_token(client, user, make_user):
    new = token_create(user=user, name="laptop")
    client.force_login(make_user())
    assert client.get(reverse("tokens:revoke", args=[new.token.pk])).status_code == 404


def test_the_tokens_tables_have_no_empty_header(dad_client, user):
    token_create(user=user, name="laptop")
    grant_for(user)
    body = dad_client.get(reverse("tokens:list")).content.decode()
    headers = re.findall(r'<th scope="col">(.*?)</th>', body)
    assert headers == [
        *("Name", "Starts with", "Created", "Last used", "Expires", "State", "Action"),
        *("App", "Signed in", "Last used", "Ends", "State", "Action"),
    ]
