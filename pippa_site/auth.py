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
from django.db import connections, router
from django.utils import timezone

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
        using = router.db_for_read(model)
        connection = connections[using]
        table = connection.ops.quote_name(model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT session_data FROM {table} "
                "WHERE session_key = %s AND expire_date > %s",
                [
                    key,
                    connection.ops.adapt_datetimefield_value(timezone.now()),
                ],
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
        quote = connections[router.db_for_read(model)].ops.quote_name
        table, pk = quote(model._meta.db_table), quote(model._meta.pk.column)
        try:
            user_id = model._meta.pk.to_python(user_id)
        except ValidationError:  # a session naming a malformed id is no user
            return None
        found = list(
            model._default_manager.raw(
                f"SELECT * FROM {table} WHERE {pk} = %s", [user_id]
            )
        )
        if not found:
            return None
        return found[0] if self.user_can_authenticate(found[0]) else None
