"""The vendors' official SDKs judge every request an adapter sends.

Each ``judge_*`` returns the problems it found (an empty list: the vendor's
own types accept the request). The types are the SDKs', not ours:

- OpenAI (``openai``): the body against ``CompletionCreateParamsNonStreaming``.
- Anthropic (``anthropic``): the body against ``MessageCreateParamsNonStreaming``.
- Gemini (``google-genai``): each part of the REST body against the SDK's
  pydantic models (``types.Content``, ``types.Tool``, ``types.GenerationConfig``
  ...), read as JSON so that bytes such as ``thoughtSignature`` are base64.

The OpenAI and Anthropic request types are TypedDicts; validated with
pydantic's ``TypeAdapter`` they silently drop keys they do not declare, so the
judge compares what went in with what validated and reports each dropped key
(``tool_call_id`` where ``tool_use_id`` belongs is then an error, not a
no-op). google-genai's models forbid unknown keys themselves, and the judge
also checks that the validated model dumps back to exactly what was sent.

A few rules the types cannot express are documented by the vendors and
checked beside them: tool results answer the calls of the turn before, the
number of Gemini function responses equals the calls they answer, Gemini
roles are "user" and "model", and a Gemini ``parameters`` OBJECT has
properties.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import pydantic
from pydantic import TypeAdapter, ValidationError

GEMINI_BODY_KEYS = {
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "safetySettings",
    "generationConfig",
    "cachedContent",
}
GEMINI_ROLES = {"user", "model"}


# -- TypedDict checks: validate, then diff what went in against what validated --


@cache
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


def typed_problems(tp: Any, value: Any, *, where: str = "body") -> list[str]:
    """Validate ``value`` against the SDK type ``tp``; unknown keys are problems."""
    try:
        validated = _materialize(_adapter(tp).validate_python(value))
    except ValidationError as exc:
        return [_describe(where, err) for err in _relevant(exc.errors())][:8]
    return [f"{where}.{path}: unknown key" for path in _dropped(value, validated)]


def _relevant(errors: list[dict]) -> list[dict]:
    """Drop the union members whose ``type``/``role`` already says "not me".

    A tool_result block with a wrong key fails every content-block type; the
    useful complaint is the one from ``ToolResultBlockParam``. The deepest
    complaints come first.
    """
    not_meant = {
        err["loc"][:-1]
        for err in errors
        if err["type"] == "literal_error"
        and err["loc"][-1] in ("type", "role")
        and len(err["loc"]) >= 2
        and str(err["loc"][-2])[:1].isupper()
    }
    kept = [
        err
        for err in errors
        if not any(err["loc"][: len(member)] == member for member in not_meant)
    ]
    return sorted(kept or errors, key=lambda err: -len(err["loc"]))


def _describe(where: str, err: dict) -> str:
    loc = ".".join(str(part) for part in err.get("loc", ()))
    return f"{where}.{loc}: {err.get('msg')}"


def _materialize(value: Any) -> Any:
    """Turn pydantic's lazy ``Iterable`` validators into lists (which validates them)."""
    if isinstance(value, pydantic.BaseModel):
        # A response model accepted in a request (the SDKs allow that): its
        # declared fields only, so that keys it merely tolerates count as unknown.
        return {
            (field.alias or name): _materialize(getattr(value, name))
            for name, field in type(value).model_fields.items()
            if name in value.model_fields_set
        }
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_materialize(v) for v in value]
    if isinstance(value, Iterator):
        return [_materialize(v) for v in value]
    return value


def _dropped(sent: Any, validated: Any, path: str = "") -> Iterator[str]:
    if isinstance(sent, dict) and isinstance(validated, dict):
        for key, value in sent.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in validated:
                yield where
            else:
                yield from _dropped(value, validated[key], where)
    elif isinstance(sent, list) and isinstance(validated, list):
        for i, (a, b) in enumerate(zip(sent, validated, strict=False)):
            yield from _dropped(a, b, f"{path}[{i}]")


# -- OpenAI Chat Completions ----------------------------------------------------


def judge_openai(body: dict, headers: dict[str, str], *, api_key: str) -> list[str]:
    from openai.types.chat.completion_create_params import (
        CompletionCreateParamsNonStreaming,
    )

    problems = []
    if headers.get("authorization") != f"Bearer {api_key}":
        problems.append("Incorrect API key provided")
    problems += typed_problems(CompletionCreateParamsNonStreaming, body)
    if problems:
        return problems
    asked: set[str] = set()
    for i, m in enumerate(body["messages"]):
        for call in m.get("tool_calls") or []:
            asked.add(call["id"])
            if not _json_object(call["function"]["arguments"]):
                problems.append(
                    f"messages[{i}].tool_calls: arguments must be a JSON object string"
                )
        if m["role"] == "tool" and m["tool_call_id"] not in asked:
            problems.append(
                f"messages[{i}]: messages with role 'tool' must be a response to a "
                "preceding message with 'tool_calls'"
            )
    return problems


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


# -- Anthropic Messages ---------------------------------------------------------


def judge_anthropic(
    body: dict, headers: dict[str, str], *, api_key: str, versions: set[str]
) -> list[str]:
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

    problems = []
    if headers.get("x-api-key") != api_key:
        problems.append("invalid x-api-key")
    if headers.get("anthropic-version") not in versions:
        problems.append(
            f"anthropic-version: {headers.get('anthropic-version')!r} is not a version "
            f"the API takes ({', '.join(sorted(versions))})"
        )
    problems += typed_problems(MessageCreateParamsNonStreaming, body)
    if problems:
        return problems
    # tool_result blocks answer the tool_use blocks of the assistant turn
    # right before them, every one of them.
    pending: set[str] = set()
    for i, m in enumerate(body["messages"]):
        blocks = m["content"] if isinstance(m["content"], list) else []
        if m["role"] == "assistant":
            if pending:
                problems.append(
                    f"messages[{i}]: tool_use ids were found without tool_result "
                    f"blocks immediately after: {', '.join(sorted(pending))}"
                )
            pending = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        elif m["role"] == "user":
            answered = {
                b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"
            }
            if answered - pending:
                problems.append(
                    f"messages[{i}]: unexpected tool_use_id found in tool_result "
                    f"blocks: {', '.join(sorted(answered - pending))}"
                )
            if pending - answered:
                problems.append(
                    f"messages[{i}]: tool_use ids were found without tool_result "
                    f"blocks immediately after: {', '.join(sorted(pending - answered))}"
                )
            pending = set()
    for i, tool in enumerate(body.get("tools") or []):
        schema = tool.get("input_schema") or {}
        if schema.get("type") != "object":
            problems.append(f"tools[{i}].input_schema.type: must be 'object'")
    return problems


# -- Gemini generateContent -------------------------------------------------------


def judge_gemini(
    path: str, body: dict, headers: dict[str, str], *, api_key: str
) -> list[str]:
    from google.genai import types

    problems = []
    if not (path.startswith("/v1beta/models/") and path.endswith(":generateContent")):
        problems.append(f"unknown path {path}")
    if headers.get("x-goog-api-key") != api_key:
        problems.append("API key not valid. Please pass a valid API key.")
    unknown = set(body) - GEMINI_BODY_KEYS
    if unknown:
        problems.append(f'Invalid JSON payload received. Unknown name "{min(unknown)}"')
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return [*problems, "contents is not specified"]
    for i, content in enumerate(contents):
        problems += model_problems(types.Content, content, where=f"contents[{i}]")
        if isinstance(content, dict) and content.get("role") not in GEMINI_ROLES:
            problems.append(
                f"contents[{i}].role: please use a valid role: user, model "
                f"(got {content.get('role')!r})"
            )
    for key, model in (
        ("systemInstruction", types.Content),
        ("toolConfig", types.ToolConfig),
        ("generationConfig", types.GenerationConfig),
    ):
        if key in body:
            problems += model_problems(model, body[key], where=key)
    for i, tool in enumerate(body.get("tools") or []):
        problems += model_problems(types.Tool, tool, where=f"tools[{i}]")
        for j, decl in enumerate(tool.get("functionDeclarations") or []):
            problems += _declaration_problems(decl, where=f"tools[{i}][{j}]")
    if problems:
        return problems
    return _function_turn_problems(contents)


def model_problems(
    model: type[pydantic.BaseModel], value: Any, *, where: str
) -> list[str]:
    """Validate as the REST JSON it is; the model must dump back to what was sent."""
    try:
        parsed = model.model_validate_json(json.dumps(value))
    except ValidationError as exc:
        return [_describe(where, err) for err in exc.errors()][:8]
    again = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
    if again != value:
        return [f"{where}: not in the SDK's form (sent {value!r}, read {again!r})"]
    return []


def _declaration_problems(decl: dict, *, where: str) -> list[str]:
    from google.genai import types

    problems = []
    if "parameters" in decl and "parametersJsonSchema" in decl:
        problems.append(
            f"{where}: parameters and parametersJsonSchema exclude each other"
        )
    if "parametersJsonSchema" in decl:
        schema = decl["parametersJsonSchema"]
        problems += model_problems(
            types.JSONSchema, schema, where=f"{where}.parametersJsonSchema"
        )
        if schema.get("type") != "object":
            problems.append(f"{where}.parametersJsonSchema: must describe an object")
    if "parameters" in decl:
        problems += [
            f"{where}.parameters{p}: should be non-empty for OBJECT type"
            for p in _empty_objects(decl["parameters"])
        ]
    return problems


def _empty_objects(schema: Any, path: str = "") -> Iterator[str]:
    if not isinstance(schema, dict):
        return
    if str(schema.get("type", "")).upper() == "OBJECT" and not schema.get("properties"):
        yield path or "."
    for key, sub in (schema.get("properties") or {}).items():
        yield from _empty_objects(sub, f"{path}.properties.{key}")
    if "items" in schema:
        yield from _empty_objects(schema["items"], f"{path}.items")


def _function_turn_problems(contents: list[dict]) -> list[str]:
    """Function responses answer the calls of the model turn right before them."""
    problems = []
    calls: list[str] = []
    for i, content in enumerate(contents):
        parts = content.get("parts") or []
        if not parts:
            problems.append(f"contents[{i}].parts: must not be empty")
        names = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
        answers = [p["functionResponse"] for p in parts if "functionResponse" in p]
        if names and content["role"] != "model":
            problems.append(f"contents[{i}]: functionCall parts come from the model")
        if answers:
            if content["role"] != "user":
                problems.append(
                    f"contents[{i}]: functionResponse parts come from the user"
                )
            if len(answers) != len(calls):
                problems.append(
                    f"contents[{i}]: Please ensure that the number of function response "
                    "parts is equal to the number of function call parts of the "
                    "function call turn."
                )
            for answer in answers:
                if answer.get("name") not in calls:
                    problems.append(
                        f"contents[{i}]: functionResponse {answer.get('name')!r} answers "
                        "no functionCall of the turn before"
                    )
        calls = names
    return problems
