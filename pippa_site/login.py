"""The one login check of every page a person signs in for, htmx-aware.

``login_required`` is Django's, except for an htmx request without a session
(a card's poll, a button's swap after the session ended): that one gets an
``HX-Redirect`` to the login page, which htmx follows as a whole-page
navigation, instead of the login form swapped into the middle of a page.
Every view that needs a signed-in person uses it (a test walks the URL
patterns); what must stay open (the login page itself, the one-click "turn
messages off" link, the OAuth and API endpoints that prove who asks another
way) simply does not.
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required as django_login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


def login_required(view):
    """Django's ``login_required``; an htmx request without a session gets a
    whole-page redirect to the login page (back to the page it came from)."""
    checked = django_login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        htmx = getattr(request, "htmx", None)
        if htmx and not request.user.is_authenticated:
            next_url = htmx.current_url_abs_path or request.get_full_path()
            login = resolve_url(settings.LOGIN_URL)
            return HttpResponseClientRedirect(
                f"{login}?{urlencode({'next': next_url})}"
            )
        return checked(request, *args, **kwargs)

    return wrapper
