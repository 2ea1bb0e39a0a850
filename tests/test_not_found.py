"""One not-found error (pippa_site.errors.NotFound): every owner getter and view
raises it, a page shows it as the site's 404, and both program doors map it by
type, the same for another user's row as for a missing one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.http import Http404
from mcp.server.mcpserver.exceptions import ToolError

from api.services import token_create
from pippa_mcp import server
from pippa_mcp.server import acting_as
from pippa_site.errors import NotFound
from tasks.documents import task_get_for_user

REPO = Path(__file__).resolve().parents[1]
NOT_THE_SITE = {"tests", "bench", ".venv"}


def _raises_http404(path: Path) -> bool:
    """Whether the module raises Http404 itself, or (outside the admin, the
    staff's repair room, which reads every row) lets get_object_or_404 do it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            call = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if getattr(call, "id", getattr(call, "attr", "")) == "Http404":
                return True
        if isinstance(node, ast.Call) and path.name != "admin.py":
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "get_object_or_404":
                return True
    return False


def test_no_module_of_the_site_raises_djangos_http404_itself():
    packages = [
        d
        for d in REPO.iterdir()
        if (d / "__init__.py").exists() and d.name not in NOT_THE_SITE
    ]
    assert {"api", "dashboard", "pippa_site", "tasks"} <= {d.name for d in packages}
    offenders = [
        str(path.relative_to(REPO))
        for package in packages
        for path in package.rglob("*.py")
        if _raises_http404(path)
    ]
    assert offenders == []


def test_not_found_is_the_one_error_and_djangos_404_too():
    assert issubclass(NotFound, Http404)


@pytest.mark.django_db
def test_anothers_task_is_not_found_alike_at_every_door(
    client, make_user, make_task, make_conversation
):
    theirs = make_task(conversation=make_conversation(owner=make_user(username="mum")))
    dad = make_user(username="dad")
    missing = theirs.pk + 1000
    client.force_login(dad)
    raw = token_create(user=dad, name="runner").raw

    for task_id in (theirs.pk, missing):
        with pytest.raises(NotFound):
            task_get_for_user(user=dad, task_id=task_id)

        assert client.get(f"/tasks/{task_id}/").status_code == 404

        api = client.get(
            f"/api/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {raw}"}
        )
        assert api.status_code == 404
        assert api.json()["code"] == "not_found"

        with acting_as(dad), pytest.raises(ToolError, match="not found"):
            server.get_task(task_id=task_id)
