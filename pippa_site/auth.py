"""Every logged-in request reads its session and its user: do both in plain SQL.

Django's database sessions and ModelBackend read them through the ORM, whose
query building costs several times the query itself on a small table; for a
304 or a 204 poll those two reads are most of the request. Same tables, same
rows, same rules: an expired or unknown session key is no session; a user must
be allowed to authenticate (``is_active``).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.backends import db
from django.contrib.sessions.backends.base import VALID_KEY_CHARS
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connection, connections

from pippa_site.hotsql import db_datetime, row_get, utc_now

_KEY_CHARS = frozenset(VALID_KEY_CHARS)


class SessionStore(db.SessionStore):
    """``django.contrib.sessions.backends.db``, with the per-request read in SQL."""

    def _get_session_from_db(self):
        key = self.session_key
        # Keys are made of VALID_KEY_CHARS; anything else (a forged cookie, a
        # NUL that PostgreSQL would refuse with an error) names no session.
        if not key or not set(key) <= _KEY_CHARS:
            self._session_key = None
            return None
        model = self.model
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT session_data FROM {_table(model)} "
                "WHERE session_key = %s AND expire_date > %s",
                [key, db_datetime(utc_now())],
            )
            row = cursor.fetchone()
        if row is None:
            self._session_key = None
            return None
        return model(session_key=key, session_data=row[0])


class UserBackend(ModelBackend):
    """ModelBackend, loading the session's user with one raw query."""

    def get_user(self, user_id):
        model = get_user_model()
        try:
            user_id = model._meta.pk.to_python(user_id)
        except ValidationError:  # a session naming a malformed id is no user
            return None
        user = row_get(model, user_id)
        if user is None:
            return None
        return user if self.user_can_authenticate(user) else None


def _table(model) -> str:
    return connections[DEFAULT_DB_ALIAS].ops.quote_name(model._meta.db_table)
