"""What the registry says of a step tool's arguments (``Tool.args_schema``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tasks.tools import Tool, ToolContext, ToolResult, tool_get


def test_a_tools_arguments_are_a_json_schema_with_types_defaults_and_descriptions():
    schema = tool_get("demo.chart").args_schema

    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"source", "title", "pause"}
    assert schema["properties"]["source"]["type"] == "integer"
    assert schema["properties"]["source"]["default"] == 2
    assert "earlier step" in schema["properties"]["source"]["description"]


def test_a_tool_taking_any_keyword_says_so_and_required_ones_are_required():
    def loose(
        ctx: ToolContext,
        *,
        url: Annotated[str, Field(description="where")],
        **more,
    ) -> ToolResult:
        return ToolResult(data=b"")

    schema = Tool(name="x.loose", fn=loose).args_schema
    assert schema["additionalProperties"] is True
    assert schema["required"] == ["url"]


class Opaque:
    """A type of a user's own, with no JSON schema."""


def test_a_type_no_json_schema_describes_gives_a_schema_that_says_so():
    def odd(ctx: ToolContext, *, thing: Opaque | None = None) -> ToolResult:
        return ToolResult(data=b"")

    schema = Tool(name="x.odd", fn=odd).args_schema
    assert schema["type"] == "object"
    assert schema["description"].startswith("its arguments' types have no JSON schema")
    assert "Opaque" in schema["description"]
