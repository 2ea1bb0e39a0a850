"""The architecture is a contract: import-linter checks the imports (here, and
`make lint`), no module of the apps outgrows a reading, and markup lives in
templates, never in a Python module."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]


def test_every_import_points_down_and_no_app_imports_in_a_circle(capsys, monkeypatch):
    """The contracts of pyproject.toml, checked in this process (what `make lint`
    runs as lint-imports): a wrong arrow fails the fast suite too."""
    monkeypatch.chdir(REPO)

    status = lint_imports(no_cache=True, no_logo=True)

    out = capsys.readouterr().out
    assert status == 0, out[-4000:]
    assert "0 broken" in out
    assert "The ground imports no app" in out


def test_the_ground_contract_names_every_app():
    """pippa_site may import no app: the forbidden list is every package of the site."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]
    apps = {
        init.parent.name
        for init in REPO.glob("*/__init__.py")
        if init.parent.name not in NOT_THE_SITE | {"pippa_site"}
    }
    (ground,) = [
        c for c in config["contracts"] if c.get("source_modules") == ["pippa_site"]
    ]

    assert ground["type"] == "forbidden"
    assert set(ground["forbidden_modules"]) == apps
    assert set(config["root_packages"]) == apps | {"pippa_site"}


# What may make markup safe outside the templates: the admin's small columns
# and template tags (a link, a badge). Nothing else draws page markup.
SAFE_MARKUP_ALLOWED: set[str] = set()
SAFE_MARKUP_NAMES = {"format_html", "format_html_join", "mark_safe", "SafeString"}
# Every package of the site: the top-level ones but the tests and the bench
# (whose SVG strings are artifacts' data, not pages).
NOT_THE_SITE = {"tests", "bench"}


def _draws_markup(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in (
            "django.utils.html",
            "django.utils.safestring",
        ):
            names |= {a.name for a in node.names} & SAFE_MARKUP_NAMES
        elif isinstance(node, ast.Attribute) and node.attr in SAFE_MARKUP_NAMES:
            names.add(node.attr)
    return names


def test_no_python_module_draws_page_markup_outside_admin_columns_and_tags():
    drawn = {}
    packages = [
        init.parent
        for init in REPO.glob("*/__init__.py")
        if init.parent.name not in NOT_THE_SITE
    ]
    assert {p.name for p in packages} >= {"api", "artifacts", "dashboard", "tasks"}
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if (
                "/migrations/" in rel
                or path.name == "admin.py"
                or "/templatetags/" in rel
                or rel in SAFE_MARKUP_ALLOWED
            ):
                continue
            if names := _draws_markup(path):
                drawn[rel] = sorted(names)

    assert drawn == {}, "markup belongs in templates/: " + repr(drawn)


# Django's internals the site once reached into, to save microseconds: the
# connection's query log and error wrapper, its driver connection's own
# cursor, its instance dict, the session store's private read. The site uses Django's own cursor,
# ORM and sessions instead (docs/serving-and-bench.md).
DJANGO_INTERNALS = re.compile(
    r"queries_log|queries_logged|wrap_database_errors|_get_session_from_db"
    r"|(?:connection|connections\[[^]]*\]|db)\.(?:__dict__|connection\.)"
)


def test_no_module_of_the_site_reaches_into_djangos_internals():
    found = []
    for package in sorted(REPO.iterdir()):
        if not (package / "__init__.py").exists() or package.name in NOT_THE_SITE:
            continue
        for path in sorted(package.rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if DJANGO_INTERNALS.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert found == []


# A module a maintainer reads whole: past this many lines one is split by what
# it serves (pippa_mcp's tools by what they act on, dashboard's selectors by page).
MODULE_MAX_LINES = 900


def _app_modules():
    for package in sorted(REPO.iterdir()):
        if not (package / "__init__.py").exists() or package.name in NOT_THE_SITE:
            continue
        for path in sorted(package.rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_no_module_of_the_apps_is_over_900_lines():
    assert any(p.parent.name == "pippa_mcp" for p in _app_modules())
    too_long = {
        path.relative_to(REPO).as_posix(): lines
        for path in _app_modules()
        if (lines := len(path.read_text().splitlines())) > MODULE_MAX_LINES
    }

    assert too_long == {}, f"split these by what they serve: {too_long}"
