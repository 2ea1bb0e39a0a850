"""Every limit a door states reads the one constant where its rule lives.

A door (MCP, the JSON API, the pages and their templates, the brain runner's
tool specs) that wrote a limit as a number would drift from the service that
enforces it; a scan of their source finds any such number.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The doors' modules: every module of the door apps but their models (where a
# column's length is the rule's home) and migrations, and the pages' views.
DOOR_PACKAGES = ("pippa_mcp", "api", "dashboard")
DOOR_MODULES = (
    "council/views.py",
    "notifications/views.py",
    "artifacts/views.py",
    "brains/prompt.py",
)
# Keyword arguments (pydantic's Field, ninja's Query, Django's form fields) and
# JSON-schema keys that state a limit.
LIMIT_WORDS = {
    "max_length",
    "min_length",
    "max_items",
    "min_items",
    "le",
    "lt",
    "ge",
    "gt",
    "max_value",
    "min_value",
    "max_digits",
    "maxLength",
    "minLength",
    "maxItems",
    "minItems",
    "maximum",
    "minimum",
    "exclusiveMaximum",
    "exclusiveMinimum",
}
# "At least one", "not negative": not limits a rule could move.
BOUNDS_NOT_LIMITS = {0, 1}
TEMPLATE_LIMIT = re.compile(r"\b(?:maxlength|minlength)=\"?\d+")


def _number(node: ast.AST) -> int | float | None:
    """The value of a literal number, or of arithmetic on literal numbers."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp):
            left, right = _number(node.left), _number(node.right)
            if left is not None and right is not None:
                return 1 << 64  # arithmetic on numbers: a number all the same
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def literal_limits(source: str) -> list[tuple[int, str]]:
    """(line, what) of every limit written as a number in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.Call):
            pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
        elif isinstance(node, ast.Dict):
            pairs = [
                (k.value, v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
        elif isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Call)
            and isinstance(side.func, ast.Name)
            and side.func.id == "len"
            for side in (node.left, *node.comparators)
        ):
            pairs = [("len", side) for side in (node.left, *node.comparators)]
        for word, value in pairs:
            if word not in LIMIT_WORDS and word != "len":
                continue
            number = _number(value)
            if number is not None and number not in BOUNDS_NOT_LIMITS:
                found.append((value.lineno, f"{word}={ast.unparse(value)}"))
    return sorted(found)


def _door_sources():
    for package in DOOR_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" not in path.parts and path.name != "models.py":
                yield path
    for module in DOOR_MODULES:
        yield REPO / module


def test_no_door_writes_a_limit_as_a_number():
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _door_sources()
        for line, what in literal_limits(path.read_text())
    ]

    assert found == [], "read the rule's constant instead:\n" + "\n".join(found)


def test_no_template_writes_a_length_limit_as_a_number():
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted(REPO.glob("**/templates/**/*.html"))
        if ".venv" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if TEMPLATE_LIMIT.search(line)
    ]

    assert found == [], "pass the rule's constant to the template:\n" + "\n".join(found)


def test_the_scan_finds_a_number_wherever_a_door_could_write_one():
    source = """
Worker = Annotated[str, Field(max_length=60)]
Page = Annotated[int, Query(ge=1, le=50)]
Big = Annotated[int, Field(le=2**63 - 1)]
spec = {"type": "string", "maxLength": 1000}
if len(name) > 100:
    pass
"""
    assert [what for _, what in literal_limits(source)] == [
        "max_length=60",
        "le=50",
        "le=2 ** 63 - 1",
        "maxLength=1000",
        "len=100",
    ]
    named = "Worker = Annotated[str, Field(min_length=1, max_length=WORKER_NAME_MAX)]"
    assert literal_limits(named) == []
