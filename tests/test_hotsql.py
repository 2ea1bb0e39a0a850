"""pippa_site.hotsql's row by id is the instance the ORM would give."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from artifacts.models import Artifact
from pippa_site.hotsql import row_get


@pytest.mark.django_db
def test_a_row_read_by_id_is_the_instance_the_orm_would_give(make_artifact, make_user):
    artifact = make_artifact(meta={"preview": {"sha256": "ab" * 32}, "n": [1, 2]})
    user = make_user(username="row-get", is_staff=True)

    for model, pk in ((Artifact, artifact.pk), (get_user_model(), user.pk)):
        expected = model.objects.get(pk=pk)
        got = row_get(model, pk)
        assert type(got) is model
        for field in model._meta.concrete_fields:
            name = field.attname
            assert getattr(got, name) == getattr(expected, name), name
            assert type(getattr(got, name)) is type(getattr(expected, name)), name
        assert got._state.adding is False
        assert got._state.db == "default"
    # Converted as the ORM converts: JSON decoded, dates aware, booleans bool.
    got = row_get(Artifact, artifact.pk)
    assert got.meta["n"] == [1, 2]
    assert got.created_at.tzinfo is not None
    assert row_get(get_user_model(), user.pk).is_staff is True


@pytest.mark.django_db
@pytest.mark.parametrize("pk", [0, -1, 2**63 - 1, 2**63, -(2**63) - 1, 10**30])
def test_a_row_read_by_an_id_no_row_has_is_none(pk):
    assert row_get(Artifact, pk) is None
